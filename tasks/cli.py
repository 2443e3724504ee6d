"""``deepspeech-train <Task> --config my.yaml [luigi options]``: run a task of the DAG from any directory.

The same arguments as ``luigi --module tasks <Task> ...``, with the project's Luigi
settings (retcodes, logging) wherever it runs, a check of the config, its input
files and the scheduler before any task starts (one line and exit status 2 when
one fails), quiet TensorFlow, and a log file of the run under
``<work_dir>/logs/``.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
USAGE = (
    "deepspeech-train <Task> --config CONFIG [--local-scheduler] [other luigi options]\n"
    "       deepspeech-train --template en   (print a config template: en, librispeech, common_voice, folder)"
)
TASKS = (
    "Imports",
    "Import",
    "Alphabet",
    "Features",
    "FeaturesSplit",
    "Train",
    "LanguageModel",
    "TuneDecoder",
    "Evaluate",
    "Export",
    "Transcribe",
)


def _options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="deepspeech-train", usage=USAGE, add_help=False)
    parser.add_argument("--config")
    parser.add_argument("--local-scheduler", action="store_true")
    parser.add_argument("--scheduler-host")
    parser.add_argument("--scheduler-port", type=int)
    parser.add_argument("--log-level")
    parser.add_argument("--logging-conf-file")
    return parser.parse_known_args(argv)[0]


def _print_template(name: str) -> int:
    resources = PACKAGE.parent / "pipeline" / "resources"
    template = resources / f"{name}.yaml"
    if not template.is_file():
        there = ", ".join(sorted(p.stem for p in resources.glob("*.yaml")))
        print(f"error: no config template {name!r} (there is: {there})", file=sys.stderr)
        return 2
    print(template.read_text(encoding="utf-8"), end="")
    return 0


def main(argv=None) -> int:
    """Check, then run the task through Luigi; returns the exit status (Luigi's retcodes from luigi.cfg)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--template"]:
        return _print_template(argv[1] if len(argv) > 1 else "en")
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in TASKS:
        print(f"usage: {USAGE}\ntasks: {', '.join(TASKS)}", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    options = _options(argv[1:])
    debug = (options.log_level or "").upper() == "DEBUG"
    if "LUIGI_CONFIG_PATH" not in os.environ:
        import luigi.configuration  # already imported with this package: add the file to the loaded config

        os.environ["LUIGI_CONFIG_PATH"] = str(PACKAGE / "luigi.cfg")
        luigi.configuration.add_config_path(os.environ["LUIGI_CONFIG_PATH"])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if debug else "2")

    from pipeline.config import ConfigError
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from tasks.preflight import PreflightError, check_inputs, check_scheduler

    if not options.config:
        print(f"error: --config is required ({USAGE})", file=sys.stderr)
        return 2
    try:
        config = load_config(options.config)
        check_inputs(config)
        if not options.local_scheduler:
            import luigi.configuration

            settings = luigi.configuration.get_config()
            check_scheduler(
                options.scheduler_host or settings.get("core", "scheduler_host", "127.0.0.1"),
                options.scheduler_port or settings.getint("core", "scheduler_port", 8082),
            )
    except (ConfigError, PreflightError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    log_file = Layout(config).run_log(argv[0])
    log_file.parent.mkdir(parents=True, exist_ok=True)
    os.environ["DEEPSPEECH_LOG_FILE"] = str(log_file)

    import luigi.retcodes
    from luigi.parameter import UnconsumedParameterWarning

    # luigi.cfg's [core] rpc-* keys are read by Luigi's RPC client, not by a parameter: not a mistake.
    warnings.filterwarnings("ignore", category=UnconsumedParameterWarning)
    luigi_args = ["--module", "tasks", *argv]
    if not options.logging_conf_file:
        luigi_args += [
            "--logging-conf-file",
            str(PACKAGE / ("logging-debug.ini" if debug else "logging.ini")),
        ]
    try:
        luigi.retcodes.run_with_retcodes(luigi_args)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    else:
        code = 0
    print(f"log of this run: {log_file}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
