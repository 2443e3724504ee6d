"""``deepspeech-train <Task> --config my.yaml [luigi options]``: run a task of the DAG from any directory.

The same arguments as ``luigi --module tasks <Task> ...``, with the project's Luigi
settings (retcodes, logging) wherever it runs, a check of the config, its input
files and the scheduler before any task starts (one line and exit status 2 when
one fails), quiet TensorFlow, and a log file of the run under
``<work_dir>/logs/``. SIGTERM or SIGHUP while tasks run is passed on to their
processes, and waited for (``_passing_stops_on``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
USAGE = (
    "deepspeech-train <Task> --config CONFIG [--local-scheduler] [other luigi options]\n"
    "       deepspeech-train --template en   (print a config template: en, librispeech, common_voice, folder)"
    "\n"
    "       deepspeech-train gc --config CONFIG [--config OTHER ...] [--dry-run] [--include-train]"
    "   (remove old outputs)\n"
    "--workers N: run up to N independent stages at once, within luigi.cfg's [resources] (cpu, gpu)"
)


def _options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="deepspeech-train", usage=USAGE, add_help=False)
    parser.add_argument("--config")
    parser.add_argument("--local-scheduler", action="store_true")
    parser.add_argument("--scheduler-host")
    parser.add_argument("--scheduler-port", type=int)
    parser.add_argument("--log-level")
    parser.add_argument("--logging-conf-file")
    for name in ("--task", "--split", "--corpus", "--audio"):  # a stage's parameters (tasks.preflight)
        parser.add_argument(name, default="")
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


# Luigi's options about its process lock: with one of them, Luigi handles the lock itself.
LOCK_OPTIONS = ("--no-lock", "--take-lock", "--lock-size", "--lock-pid-dir")


def _same_command_running() -> str:
    """Take Luigi's process lock (one process per command line, ``luigi.lock``) as ``luigi`` would; when
    another process holds it, their pids (Luigi itself prints only "Pid(s) {...} already running")."""
    import contextlib
    import io

    import luigi.configuration
    import luigi.lock

    pid_dir = luigi.configuration.get_config().get(
        "core", "lock_pid_dir", os.path.join(tempfile.gettempdir(), "luigi")
    )
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        acquired = luigi.lock.acquire_for(pid_dir, 1)
    if acquired:
        return ""
    found = re.search(r"Pid\(s\) \{(.*)\} already running", said.getvalue())
    return found.group(1) if found else "unknown"


def _log_file(wanted: Path) -> Path:
    """``wanted`` when its folder can be written, else a file of the same name in the temporary directory
    (a read-only work directory: a run with nothing to do, or a Transcribe, still works there)."""
    try:
        wanted.parent.mkdir(parents=True, exist_ok=True)
        with open(wanted, "a", encoding="utf-8"):
            pass
        return wanted
    except OSError as error:
        fallback = Path(tempfile.gettempdir()) / "deepspeech-logs" / wanted.name
        fallback.parent.mkdir(parents=True, exist_ok=True)
        note = f"note: {wanted.parent} cannot be written ({error.strerror}); logging to {fallback}"
        print(note, file=sys.stderr)
        return fallback


def main(argv=None) -> int:
    """Check, then run the task through Luigi; returns the exit status (Luigi's retcodes from luigi.cfg)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--template"]:
        return _print_template(argv[1] if len(argv) > 1 else "en")
    if argv[:1] == ["gc"]:
        from pipeline.stages.gc import main as gc_main

        return gc_main(argv[1:])
    from tasks.base import pipeline_tasks

    names = list(pipeline_tasks())
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in names:
        print(f"usage: {USAGE}\ntasks: {', '.join(names)}", file=sys.stderr)
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
    from tasks.preflight import (
        PreflightError,
        check_inputs,
        check_resources,
        check_scheduler,
        check_training,
        inherited_splits,
        stage_tasks,
    )
    from tasks.resources import TOTALS_VARIABLE, remote_totals, scheduler_url

    if not options.config:
        print(f"error: --config is required ({USAGE})", file=sys.stderr)
        return 2
    try:
        config = load_config(options.config)
        given = {name: getattr(options, name) for name in ("task", "split", "corpus", "audio")}
        runs = stage_tasks(config, argv[0], given)
        check_inputs(config)
        check_training(config, argv[0])
        for note in inherited_splits(config):
            print(f"note: {note}", file=sys.stderr)
        os.environ.pop(TOTALS_VARIABLE, None)  # the local scheduler's: luigi.cfg's
        if not options.local_scheduler:
            host, port = _scheduler_address(options)
            check_scheduler(host, port)
            # The tasks take no more than luigid grants (its [resources], not this machine's luigi.cfg).
            totals = remote_totals(scheduler_url(host, port))
            if totals is not None:
                os.environ[TOTALS_VARIABLE] = json.dumps(totals)
                lines = [
                    ["--module", "tasks", *argv, *(["--task", t] if t and not options.task else [])]
                    for t in runs
                ]
                import luigi.parameter

                try:
                    check_resources(lines, totals, f"{host}:{port}")
                except (luigi.parameter.ParameterException, ValueError):
                    pass  # a task argument missing or bad: Luigi names it in its own words below
    except (ConfigError, PreflightError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    log_file = _log_file(Layout(config).run_log(argv[0]))
    os.environ["DEEPSPEECH_LOG_FILE"] = str(log_file)

    import luigi.configuration
    from luigi.parameter import UnconsumedParameterWarning

    # luigi.cfg's [core] rpc-* keys are read by Luigi's RPC client, not by a parameter: not a mistake.
    warnings.filterwarnings("ignore", category=UnconsumedParameterWarning)
    luigi_args = ["--module", "tasks", *argv]
    if not any(arg.split("=")[0] in LOCK_OPTIONS for arg in argv):
        running = _same_command_running()
        if running:
            print(
                f"error: the same command is already running (pid {running}); it runs the same stages, so "
                f"wait for it to finish (a second run then finds them done), or pass --no-lock to start "
                f"another anyway",
                file=sys.stderr,
            )
            return luigi.configuration.get_config().getint("retcode", "already_running", 10)
        luigi_args.append("--no-lock")  # this process holds Luigi's lock now
    if not options.logging_conf_file:
        luigi_args += [
            "--logging-conf-file",
            str(PACKAGE / ("logging-debug.ini" if debug else "logging.ini")),
        ]
    if not options.task and runs != [""]:
        print(f"note: a multi-task config: {argv[0]} of each task: --task {', '.join(runs)}", file=sys.stderr)
    code = 0
    with _passing_stops_on() as stopping:
        for task in runs:  # one Luigi run per task (each finds the shared stages done by the one before)
            task_args = luigi_args + (["--task", task] if task and not options.task else [])
            if not options.local_scheduler:
                _re_enable(task_args, options)
            done = _run_luigi(task_args)
            if stopping:  # asked to stop: what Luigi did not start stays unstarted
                code = done
                break
            if not options.local_scheduler and done in (
                _retcode("not_run", 25),
                _retcode("unhandled_exception", 40),
            ):
                done = _after_scheduler_trouble(done, task_args, options)
            code = done
            if code or stopping:
                break
    print(f"log of this run: {log_file}", file=sys.stderr)
    return code


@contextlib.contextmanager
def _passing_stops_on() -> Iterator[set]:
    """While Luigi runs: SIGTERM or SIGHUP to this process is passed on to the task processes its worker
    runs (luigi.cfg's ``force_multiprocessing``), which a signal to this process alone never reached (it
    died and left them running: a training holding its run's lock), as the stop request of
    ``pipeline.train.stop_signals``: Train stops at the end of its step, with a checkpoint (its workers
    too, after the same step), another stage as SIGTERM would stop it. The worker starts nothing more and
    this process waits for the tasks to end. The same signal again passes it on again (each process then
    acts at once) and acts here at once, as it would have; without a task running it acts at once. Yields
    the set of signals received (empty while none was)."""
    from luigi.worker import TaskProcess

    from pipeline.train.stop_signals import PASSED_ON

    owner, numbers, received = os.getpid(), (signal.SIGTERM, signal.SIGHUP), set()
    previous = {number: signal.getsignal(number) or signal.SIG_DFL for number in numbers}

    def at_once(number) -> None:
        signal.signal(number, previous[number])
        signal.raise_signal(number)

    def request(number, frame):
        if os.getpid() != owner:  # a task process forked from this one: what the signal did before
            at_once(number)
            return
        again = number in received
        received.add(number)
        tasks = _task_processes(TaskProcess)
        if tasks and (again or len(received) == 1):
            for process in tasks:
                with contextlib.suppress(OSError):
                    os.kill(process.pid, PASSED_ON)
        if again or not tasks:
            at_once(number)
            return
        interrupt = signal.getsignal(signal.SIGUSR1)  # Luigi's worker: start nothing more
        if getattr(interrupt, "__name__", "") == "handle_interrupt":
            interrupt(signal.SIGUSR1, frame)
        name = signal.Signals(number).name
        os.write(
            2,
            f"note: {name}: passed on to the running tasks (Train stops at the end of its step, with a "
            f"checkpoint) and waiting for them; nothing more is started ({name} again: at once)\n".encode(),
        )

    for number in numbers:
        signal.signal(number, request)
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _task_processes(kind: type) -> list:
    """The task processes (of Luigi's class ``kind``) its worker runs now: children of this process."""
    import multiprocessing

    return [child for child in multiprocessing.active_children() if isinstance(child, kind)]


def _scheduler_address(options) -> tuple[str, int]:
    """(host, port) of the central scheduler: the command line's, else luigi.cfg's [core]."""
    import luigi.configuration

    settings = luigi.configuration.get_config()
    host = options.scheduler_host or settings.get("core", "scheduler_host", "127.0.0.1")
    return host, options.scheduler_port or settings.getint("core", "scheduler_port", 8082)


def _re_enable(luigi_args: list[str], options) -> None:
    """Re-enable the DAG's tasks luigid disabled (``tasks.reenable``), saying so in one line."""
    from tasks.reenable import re_enable_disabled

    host, port = _scheduler_address(options)
    try:
        enabled = re_enable_disabled(luigi_args, host, port)
    except Exception as error:  # noqa: BLE001 - bad task arguments or a scheduler gone: Luigi reports them
        print(f"note: could not re-enable disabled tasks ({type(error).__name__}: {error})", file=sys.stderr)
        return
    if enabled:
        print(
            f"note: re-enabled {len(enabled)} task(s) the scheduler had disabled after their failures, to "
            f"run them again: {', '.join(enabled)}",
            file=sys.stderr,
        )


def _run_luigi(luigi_args: list[str]) -> int:
    import luigi.retcodes

    try:
        luigi.retcodes.run_with_retcodes(luigi_args)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def _retcode(name: str, default: int) -> int:
    import luigi.configuration

    return luigi.configuration.get_config().getint("retcode", name, default)


def _after_scheduler_trouble(code: int, luigi_args: list[str], options) -> int:
    """A run that ended with tasks the scheduler never let run (``not_run``) or with an uncaught error
    may have lost its scheduler: luigid stopped (one line saying what to do) or was restarted without
    this run's tasks (they are scheduled again, once: what finished is complete and is not redone)."""
    from tasks.preflight import PreflightError, check_scheduler

    host, port = _scheduler_address(options)
    try:
        check_scheduler(host, port)
    except PreflightError:
        print(
            f"error: the scheduler at {host}:{port} stopped answering during the run; the stages that "
            f"finished are kept: start it again (make scheduler) and run the same command to go on, or "
            f"run it with --local-scheduler",
            file=sys.stderr,
        )
        return code
    if code != _retcode("not_run", 25):
        return code
    print(
        f"note: the scheduler at {host}:{port} did not let the remaining tasks run (restarted during the "
        f"run, it no longer knew them); scheduling them again",
        file=sys.stderr,
    )
    return _run_luigi(luigi_args)


if __name__ == "__main__":
    sys.exit(main())
