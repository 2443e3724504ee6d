"""``python -m tasks.scheduler --state-dir DIR``: luigid as ``make scheduler`` runs it.

Luigi's own central scheduler (``luigi.server.run``) with, in ``DIR``:

- ``state.pickle``: the tasks it knows, kept across restarts (``--state-path``);
- ``history.db``: every task's runs and status changes in SQLite (luigid's
  ``[scheduler] record_task_history`` with ``[task_history] db_connection``;
  a ``db_connection`` set in luigi.cfg, e.g. PostgreSQL, wins), shown at
  ``/history`` and read by any SQLite client;
- ``luigi-server.log``: its log, rotated at midnight, ``--keep-logs`` days kept.

Everything else comes from luigi.cfg (``[resources]``, ``[scheduler]``, ``[email]``).
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import sys
from pathlib import Path

STATE_NAME, HISTORY_NAME, LOG_NAME = "state.pickle", "history.db", "luigi-server.log"


def history_url(state_dir: str | Path) -> str:
    """The SQLAlchemy URL of the history database in ``state_dir``."""
    return f"sqlite:///{Path(state_dir).resolve() / HISTORY_NAME}"


def configure(state_dir: Path) -> str:
    """Set luigid's state path and task history in Luigi's configuration; returns the history's URL."""
    import os

    import luigi.configuration

    if "LUIGI_CONFIG_PATH" not in os.environ:  # the project's luigi.cfg wherever luigid is started
        luigi.configuration.add_config_path(str(Path(__file__).resolve().parent / "luigi.cfg"))
    settings = luigi.configuration.get_config()
    settings.set("scheduler", "state_path", str(state_dir / STATE_NAME))
    settings.set("scheduler", "record_task_history", "true")
    if not settings.get("task_history", "db_connection", ""):
        if not settings.has_section("task_history"):
            settings.add_section("task_history")
        settings.set("task_history", "db_connection", history_url(state_dir))
    return settings.get("task_history", "db_connection")


def rotating_log(state_dir: Path, keep_days: int) -> None:
    """luigid's log in ``state_dir/luigi-server.log`` (and on stderr), a new file each midnight."""
    handler = logging.handlers.TimedRotatingFileHandler(
        state_dir / LOG_NAME, when="midnight", backupCount=keep_days, encoding="utf-8"
    )
    formatter = logging.Formatter("%(asctime)s %(name)s[%(process)s] %(levelname)s: %(message)s")
    console = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    for each in (handler, console):
        each.setFormatter(formatter)
        root.addHandler(each)
    root.setLevel(logging.INFO)


def main(argv=None) -> int:
    """Run luigid until it is stopped (SIGTERM or Ctrl-C save its state first)."""
    parser = argparse.ArgumentParser(prog="python -m tasks.scheduler", description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", required=True, help="state, task history and log directory")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8082)
    parser.add_argument("--keep-logs", type=int, default=14, help="days of rotated logs kept")
    args = parser.parse_args(argv)
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    history = configure(state_dir)
    rotating_log(state_dir, args.keep_logs)

    import luigi.server

    logging.getLogger("luigi").info(
        "luigid on %s:%d; state %s, task history %s", args.address, args.port, state_dir / STATE_NAME, history
    )
    luigi.server.run(api_port=args.port, address=args.address)
    return 0


if __name__ == "__main__":
    sys.exit(main())
