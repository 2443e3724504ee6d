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
- a config or data error (``FINAL_ERRORS``: the one-line errors naming a file or
  key) is never retried: the task reports ``retry_count`` 1 with its failure, so
  the scheduler disables it at once (its worker then stops waiting for it). The
  failure happens in the task's own process (luigi.cfg's ``force_multiprocessing``)
  while Luigi reads ``retry_count`` in the worker that started it: the task
  process leaves a mark (``note_failure``) that the worker's copy of the task
  reads (``retry_policy``). A damaged output found when the task was scheduled
  (``ConfigTask.complete``) is known to the worker directly.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


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
    """The config and data errors a retry cannot mend: each is one line naming the file or key."""
    from native_client.alphabet import AlphabetError
    from native_client.metadata import ExportError
    from pipeline.config import ConfigError
    from pipeline.data.manifests import CorpusError
    from pipeline.features.cache import CacheError
    from pipeline.lm.files import LanguageModelDamaged
    from pipeline.model.checkpoints import CheckpointMismatchError
    from pipeline.reports import ReportError
    from tasks.errors import StageError
    from tasks.preflight import PreflightError

    return (
        ConfigError,
        PreflightError,
        StageError,
        ReportError,
        CacheError,
        ExportError,
        LanguageModelDamaged,
        CorpusError,
        AlphabetError,
        CheckpointMismatchError,
    )


def is_final(error: BaseException) -> bool:
    """Whether ``error`` is a config or data error (never retried)."""
    return isinstance(error, final_errors())


def _mark(task_id: str, worker_pid: int) -> Path:
    digest = hashlib.sha256(task_id.encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / "deepspeech-train-final" / f"{worker_pid}-{digest}"


def note_failure(task, error: BaseException) -> None:
    """In the task's process, on failure: remember a final error for the worker that runs the task (this
    process's parent when Luigi forked it, else this very task object)."""
    if not is_final(error):
        return
    task._final_error = True
    mark = _mark(task.task_id, os.getppid())
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()


def failed_for_good(task) -> bool:
    """In the worker: whether the task's last failure was final (its mark, taken once) or the task was
    found unusable when it was scheduled."""
    mark = _mark(task.task_id, os.getpid())
    if mark.exists():
        task._final_error = True
        mark.unlink(missing_ok=True)
    return bool(getattr(task, "_final_error", False) or getattr(task, "_unusable", None))


def retry_policy(task) -> RetryPolicy:
    """The policy Luigi applies to ``task`` now (see the module's docstring)."""
    if failed_for_good(task):
        return FINAL
    return POLICIES.get(task.stage, DEFAULT)
