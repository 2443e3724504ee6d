"""How often each stage is tried again after a failure, and which failures are never retried.

Luigi retries a failed task itself: luigid (or the local scheduler) sets it back
to PENDING ``retry_delay`` seconds after it failed, and a worker still running
(``keep_alive``) runs it again, until the task has failed ``retry_count`` times
within ``disable_window`` seconds, when the scheduler disables it. Luigi takes
both numbers per task (``Task.retry_count``, ``Task.disable_window``, sent with
each status report); it has no rule by error type. The rule is built on that:

- Train: 6 failures within a day. A lost worker, a preemption (SIGTERM: Train
  saves at the end of its step first) or a killed process costs nothing to
  retry: it resumes at the exact batch of its last checkpoint.
- every other stage: 2 failures within an hour (one retry).
- a config or data error (``final_errors``: the one-line errors naming a file or
  key, a plug-in that does not load, audio that cannot be used) and a training that cannot go on
  (``TrainingError``, e.g. ``training.max_nonfinite_batches`` reached) are never
  retried: the task reports ``retry_count`` 1 with its failure, so the scheduler
  disables it at once (its worker then stops waiting for it). The
  failure happens in the task's own process (luigi.cfg's ``force_multiprocessing``)
  while Luigi reads ``retry_count`` in the worker that started it: the task
  process leaves a mark (``note_failure``) that the worker's copy of the task
  reads (``retry_policy``). A damaged output found when the task was scheduled
  (``ConfigTask.complete``) is known to the worker directly.

The mark lives under the work directory (``workdir.retry_mark``: where the
run's user writes anyway, never a folder another user made in /tmp), named by
the worker's process id and its start time (``/proc/<pid>/stat``), so a later
worker that got the same pid (containers restart at low pids) never reads it.
Leaving the mark never raises: on failure it is logged, and the error is
retried like any other (the failure text still reaches the mail).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

import luigi.rpc

log = logging.getLogger("luigi-interface")


@dataclass(frozen=True)
class RetryPolicy:
    """Failures a task may have within ``window_s`` seconds before the scheduler disables it."""

    failures: int
    window_s: int


TRAIN = RetryPolicy(failures=6, window_s=86400)
DEFAULT = RetryPolicy(failures=2, window_s=3600)
FINAL = RetryPolicy(failures=1, window_s=3600)
POLICIES = {"train": TRAIN}


def final_errors() -> tuple[type, ...]:
    """The errors a retry cannot mend or must not undo: config and data errors (each one line naming the
    file or key; a plug-in a key names that does not load), a training that cannot go on (``TrainingError``:
    ``training.max_nonfinite_batches`` non-finite batches in a row, a checkpoint of another batch plan, no
    intact checkpoint: the same run fails the same way, and a retry would resume past a non-finite streak),
    a non-chief worker whose chief's report never appeared here, and a training stopped on request
    (SIGTERM, Ctrl-C: its checkpoint is saved; running it again resumes)."""
    from native_client.alphabet import AlphabetError
    from native_client.audio import AudioError
    from native_client.metadata import ExportError
    from native_client.plugins import PluginError
    from pipeline.config import ConfigError
    from pipeline.data.manifests import CorpusError
    from pipeline.features.cache import CacheError
    from pipeline.lm.files import LanguageModelDamaged
    from pipeline.model.checkpoints import CheckpointMismatchError
    from pipeline.reports import ReportError
    from pipeline.train.checkpointing import TrainingError
    from pipeline.train.hooks import StopTraining
    from pipeline.train.multiworker import ChiefReportMissing, WorkerFinalError
    from tasks.errors import StageError
    from tasks.preflight import PreflightError

    return (
        AudioError,
        ConfigError,
        PluginError,
        PreflightError,
        StageError,
        ReportError,
        CacheError,
        ExportError,
        LanguageModelDamaged,
        CorpusError,
        AlphabetError,
        CheckpointMismatchError,
        TrainingError,
        ChiefReportMissing,
        WorkerFinalError,
        StopTraining,
    )


def is_final(error: BaseException) -> bool:
    """Whether ``error`` is a config or data error (never retried). Audio that cannot be used (Transcribe's
    ``--audio``: a folder, a file that does not decode) is, unless an I/O error made it so, which may pass."""
    from native_client.audio import AudioError

    if isinstance(error, AudioError) and _io_error(error.__cause__):
        return False
    return isinstance(error, final_errors())


# libsndfile's code for an error of the system under it (a read that failed), not of the file's content.
SF_ERR_SYSTEM = 2


def _io_error(cause: BaseException | None) -> bool:
    """Whether ``cause`` is a failed read (an OSError other than a missing file, or libsndfile's system
    error), not something the file itself says."""
    import soundfile

    if isinstance(cause, soundfile.LibsndfileError):
        return cause.code == SF_ERR_SYSTEM
    return isinstance(cause, OSError) and not isinstance(cause, FileNotFoundError)


def process_start(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``, field 22): with the
    pid, it names one process, never a later one given the same pid; "0" where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name (which may hold spaces)


def _mark(task, worker_pid: int) -> Path:
    """The mark of a final error of ``task`` for the worker ``worker_pid``: under the task's work directory
    when its config resolves, else in a folder of this user's in the temporary directory."""
    from pipeline.workdir import retry_mark

    digest = hashlib.sha256(task.task_id.encode()).hexdigest()[:24]
    name = f"{worker_pid}-{process_start(worker_pid)}-{digest}"
    try:
        work_dir = task.layout.work_dir
    except Exception:  # noqa: BLE001 - a config that does not resolve (the very error being noted)
        return Path(tempfile.gettempdir()) / f"deepspeech-train-final-{os.getuid()}" / name
    return retry_mark(work_dir, name)


def note_failure(task, error: BaseException) -> None:
    """In the task's process, on failure: remember a final error for the worker that runs the task (this
    process's parent when Luigi forked it, else this very task object). Never raises."""
    if not is_final(error):
        return
    task._final_error = True
    try:
        _tell_scheduler(task)
        mark = _mark(task, os.getppid())
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    except Exception as problem:  # noqa: BLE001 - the failure being reported matters more than the mark
        log.warning(
            "%s: could not mark its error as final (%s: %s); the scheduler may retry it",
            task.task_id,
            type(problem).__name__,
            problem,
        )


def _tell_scheduler(task) -> None:
    """Send the FINAL policy to the central scheduler from the task's process, before its worker reports
    the failure: luigid sets the policy a FAILED report carries only after counting that failure against
    the old one (luigi/scheduler.py ``add_task``), so a final error would be retried once. Sent as Luigi's
    own ``update_tracking_url`` does (``add_task`` with status RUNNING, through the task's status reporter);
    without one (a task not run by a Luigi worker) nothing is sent. With the local scheduler this cannot
    reach the worker's scheduler (the task process holds a copy): ``_phase_out_worker`` instead."""
    reporter = getattr(task, "_status_reporter", None)  # ConfigTask.run keeps it
    scheduler, worker = getattr(reporter, "_scheduler", None), getattr(reporter, "_worker_id", None)
    if scheduler is None or worker is None:
        return
    if not isinstance(scheduler, luigi.rpc.RemoteScheduler) and multiprocessing.parent_process() is not None:
        _phase_out_worker()  # a forked task process holds a copy of the local scheduler
        return
    policy = {"retry_count": FINAL.failures, "disable_window": FINAL.window_s}
    scheduler.add_task(task_id=task.task_id, worker=worker, status="RUNNING", retry_policy_dict=policy)


def _phase_out_worker() -> None:
    """With the local scheduler the policy cannot reach the worker's scheduler (this process holds a copy)
    and a final error would be retried once: a stopped Train would resume and finish. Instead the worker
    that forked this task process is told to start nothing more (Luigi's SIGUSR1: it finishes what runs,
    then ends, as after any failure that disables a task). Only when the worker installed that handler:
    a forked process inherits its parent's handlers, so this process sees it; without it SIGUSR1 would
    kill the parent."""
    handler = signal.getsignal(signal.SIGUSR1)
    if (
        multiprocessing.parent_process() is not None
        and getattr(handler, "__name__", "") == "handle_interrupt"
    ):
        os.kill(os.getppid(), signal.SIGUSR1)


def failed_for_good(task) -> bool:
    """In the worker: whether the task's last failure was final (its mark, taken once) or the task was
    found unusable when it was scheduled."""
    try:
        mark = _mark(task, os.getpid())
        if mark.exists():
            task._final_error = True
            mark.unlink(missing_ok=True)
    except OSError:
        pass
    return bool(getattr(task, "_final_error", False) or getattr(task, "_unusable", None))


def retry_policy(task) -> RetryPolicy:
    """The policy Luigi applies to ``task`` now (see the module's docstring)."""
    if failed_for_good(task):
        return FINAL
    return POLICIES.get(task.stage, DEFAULT)
