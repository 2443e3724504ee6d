"""Multi-worker training on one machine: start N worker processes on 127.0.0.1, each with its own TF_CONFIG.

This is what the Train task does with ``distribution.local_workers: N``. On a
real cluster, start ``python -m pipeline.stages.train_worker --config X`` (or the Train
task) on each machine with that machine's ``TF_CONFIG`` instead.

While its workers run, the launcher passes a signal's stop request on to them and
waits (``pipeline.train.stop_signals``): they agree on a step, each saves and exits
``STOPPED``, and the launcher raises ``WorkersStopped`` (a ``StopTraining``).
A worker runs with ``python -P``: the launcher's working directory stays off its
``sys.path`` (a ``yaml.py`` there would replace the real module in every worker).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.reports import ReportError, TrainReport, read_report
from pipeline.train.bind_address import bound_environment
from pipeline.train.distribute import DistributionError
from pipeline.train.hooks import StopTraining
from pipeline.train.stop_signals import STOPPED, SignalStop, pass_stop_on, stop_on_signals
from pipeline.workdir import TrainRun

# A worker's exit status for an error no retry mends (``train_worker``): its last line says which.
FINAL = 5

# worker index -> its log file
LogPaths = Callable[[int], Path]

PR_SET_PDEATHSIG = 1

# The directory this process's code comes from (the checkout, or site-packages): the workers run the same.
CODE_ROOT = Path(__file__).resolve().parents[2]


class WorkersStopped(StopTraining):  # noqa: N818 - a request carried out, not an error
    """Every worker stopped on request after the same step (``step``), with a checkpoint of it."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def worker_command(*args: str) -> list[str]:
    """The command line of a training worker (``pipeline.stages.train_worker``) with ``args``. ``-P``: the
    working directory is not put on its ``sys.path``, where a ``yaml.py`` (any module's name) would replace
    the real module; ``PYTHONPATH`` still counts (``worker_environment``). Not ``-I`` or ``-E``: they would
    drop it."""
    return [sys.executable, "-P", "-m", "pipeline.stages.train_worker", *args]


def worker_environment(env: dict) -> dict:
    """``env`` with ``CODE_ROOT`` first on ``PYTHONPATH``: a worker runs this process's code, which without
    the working directory on its path (``worker_command``) it would not find when run from a checkout, or
    would take from another installed copy."""
    paths = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    root = str(CODE_ROOT)
    return {**env, "PYTHONPATH": os.pathsep.join([root, *(entry for entry in paths if entry != root)])}


def free_ports(count: int) -> list[int]:
    """``count`` TCP ports free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_config(addresses: list[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a cluster of ``addresses``."""
    return json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})


def _die_with_parent() -> None:
    """In the child before exec: have the kernel SIGKILL this worker when its parent dies
    (Linux PR_SET_PDEATHSIG), so that a killed launcher leaves no orphan training on."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start_workers(
    config_path: str | Path,
    count: int,
    logs: LogPaths,
    env: dict | None = None,
    worker_args: tuple[str, ...] = (),
) -> list[subprocess.Popen]:
    """Start ``count`` workers of ``python -P -m pipeline.stages.train_worker`` (``worker_command``, with
    ``worker_args`` after ``--config``); worker i's output goes to ``logs(i)`` (``TrainRun.worker_log`` for
    a Train run)."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(count)]
    processes = []
    for index in range(count):
        worker_env = bound_environment(tf_config(addresses, index), {**os.environ, **(env or {})})
        logs(index).parent.mkdir(parents=True, exist_ok=True)
        log = open(logs(index), "w")
        processes.append(
            subprocess.Popen(
                worker_command("--config", str(config_path), *worker_args),
                env=worker_environment(worker_env),
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        )
    return processes


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def wait_for_workers(
    processes: list[subprocess.Popen],
    logs: LogPaths,
    grace_s: float,
    on_poll: Callable[[str], None] = lambda last_line: None,
    stopped_by: Callable[[], str] = lambda: "",
) -> None:
    """Wait for every worker; when one fails, give the others ``grace_s`` seconds to fail too
    (their collective timeout), then kill them. Raises DistributionError naming the failed workers, or
    ``WorkersStopped`` when they stopped on request (exit ``STOPPED``; ``stopped_by()``: the signal this
    process passed on to them, if it did)."""
    failed_at = None
    while True:
        codes = [p.poll() for p in processes]
        if all(code is not None for code in codes):
            break
        if any(code not in (None, 0) for code in codes):
            failed_at = failed_at or time.monotonic()
            if time.monotonic() - failed_at > grace_s:
                for process, code in zip(processes, codes, strict=False):
                    if code is None:
                        process.kill()
                        process.wait()
                break
        on_poll(_tail(logs(0), 1))
        time.sleep(1.0)
    codes = [p.wait() for p in processes]
    failures = [(i, c) for i, c in enumerate(codes) if c not in (0, STOPPED)]
    final = [i for i, c in failures if c == FINAL]
    if final:  # a worker's one line (a config error, a changed init_from, a non-finite stop): never retried
        raise WorkerFinalError(f"worker {final[0]}: {_tail(logs(final[0]), 1).removeprefix('error: ')}")
    if failures:
        details = "; ".join(f"worker {i} exit {c}: {_tail(logs(i))}" for i, c in failures)
        raise DistributionError(f"multi-worker training failed ({details}); logs in {logs(0).parent}")
    if STOPPED in codes:
        raise _stopped(logs, codes, stopped_by())


def _stopped(logs: LogPaths, codes: list[int], by: str) -> WorkersStopped:
    """What the workers that exited ``STOPPED`` (of ``codes``) stopped at, as one StopTraining: in the
    words of the first of them, or naming ``by``, the signal that the launcher passed on."""
    results = {i: worker_result(logs(i)) or {} for i, code in enumerate(codes) if code == STOPPED}
    steps = {result.get("global_step") for result in results.values()}
    if len(steps) != 1 or None in steps:
        found = ", ".join(f"worker {i}: {result.get('global_step', '?')}" for i, result in results.items())
        raise DistributionError(
            f"the workers stopped on request but not after one step ({found}); logs in {logs(0).parent}"
        )
    step = steps.pop()
    if not by:
        first = results[min(results)]
        return WorkersStopped(first.get("stopped") or f"training stopped on request after step {step}", step)
    every = f" on all {len(codes)} workers" if len(codes) > 1 else ""
    return WorkersStopped(
        f"training stopped by {by} after step {step}{every}; a checkpoint of that step was saved: run Train "
        f"again to resume",
        step,
    )


def launch_local_workers(
    config_path: str | Path,
    count: int,
    logs: LogPaths,
    grace_s: float,
    on_poll: Callable[[str], None] = lambda last_line: None,
    worker_args: tuple[str, ...] = (),
) -> None:
    """Run ``count`` local workers to the end (see ``start_workers`` and ``wait_for_workers``); a signal's
    stop request is passed on to them (``pipeline.train.stop_signals``)."""
    processes = start_workers(config_path, count, logs, worker_args=worker_args)
    stop = SignalStop()
    try:
        with stop_on_signals(stop, pass_on=lambda: pass_stop_on(processes)):
            wait_for_workers(processes, logs, grace_s, on_poll, stopped_by=lambda: stop.requested)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


def run_cluster_worker(
    config_path: str | Path,
    index: int,
    logs: LogPaths,
    grace_s: float,
    on_poll: Callable[[str], None] = lambda last_line: None,
    worker_args: tuple[str, ...] = (),
) -> None:
    """Run this machine's worker of a cluster (``TF_CONFIG`` already set) as a child process, so that it
    starts with the bind-address library; its output goes to ``logs(index)``; ``worker_args`` as for
    ``start_workers``. A signal's stop request is passed on to it (``pipeline.train.stop_signals``); the
    workers of the cluster agree on the step."""
    logs(index).parent.mkdir(parents=True, exist_ok=True)
    with open(logs(index), "w") as log:
        process = subprocess.Popen(
            worker_command("--config", str(config_path), *worker_args),
            env=worker_environment(bound_environment(os.environ["TF_CONFIG"])),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    stop = SignalStop()
    try:
        with stop_on_signals(stop, pass_on=lambda: pass_stop_on([process])):
            wait_for_workers(
                [process], lambda _: logs(index), grace_s, on_poll, stopped_by=lambda: stop.requested
            )
    finally:
        if process.poll() is None:
            process.kill()


def worker_result(log: Path) -> dict | None:
    """The result a worker printed (``pipeline.stages.train_worker``: its index, final global step and weights
    digest), read from its log: the last such line, as gRPC may log after it; None when there is none."""
    try:
        lines = [
            line for line in log.read_text(errors="replace").splitlines() if line.startswith('{"worker"')
        ]
    except OSError:
        return None
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


class WorkerFinalError(DistributionError):
    """A worker ended on an error no retry mends (its exit status ``FINAL``); its one line. A final error
    (``tasks.retries``)."""


class ChiefReportMissing(DistributionError):
    """A non-chief worker finished its part but the chief's report never appeared here (the work directory
    is not shared, or the chief failed). Not worth a retry of this worker alone: it would wait for a chief
    that has finished."""


def wait_for_chief_report(run: TrainRun, result: dict, timeout_s: float, poll_s: float = 1.0) -> TrainReport:
    """The chief's ``train_report.json`` of the run a non-chief worker just finished with ``result``
    (``worker_result``): the report whose global step and weights digest are the worker's own, waited for
    up to ``timeout_s`` (the chief writes it after its last save).

    This is what a non-chief worker's Train task stands on: it succeeds only when the run it took part in
    has a report this machine can read. Raises DistributionError naming the path when none appears (the
    work directory is not shared, or the chief failed).
    """
    deadline = time.monotonic() + timeout_s
    found = None
    while True:
        if run.report.is_file():
            try:
                report = read_report(run.report, TrainReport)
            except ReportError:
                report = None  # being replaced, or damaged: look again until the deadline
            if report is not None:
                found = (report.global_step, report.weights_sha256)
                if found == (result["global_step"], result["weights_sha256"]):
                    return report
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    other = f" (the one there does not match: step {found[0]}, weights {found[1][:12]})" if found else ""
    raise ChiefReportMissing(
        f"worker {result['worker']} finished its part of the run (step {result['global_step']}) but the "
        f"chief's report of it did not appear at {run.report} within {timeout_s:.0f} s{other}. A non-chief "
        f"worker's Train output is the chief's report: put paths.work_dir on a filesystem every worker "
        f"shares, and see the chief's log if it failed"
    )
