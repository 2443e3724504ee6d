"""A run that ``training.max_nonfinite_batches`` stopped stays stopped until that setting is raised.

The stop saves the run's position past the bad streak when it falls between two
update windows, so a rerun (Luigi's retry, or the same command again) would
resume after the streak with its count at 0 and train on as though nothing had
happened. The chief therefore records the stop in the Train run
(``TrainRun.nonfinite_stop``: the limit it reached, the step and the one-line
error), and every later run of the same Train run raises the same error before
it restores anything, until ``training.max_nonfinite_batches`` is raised above
the recorded limit (it is in no fingerprint: the same run goes on, the record is
removed) or the run is started over (``make rerun STAGE=Train``).
"""

from __future__ import annotations

import json
import logging

from pipeline.files import write_json_atomic
from pipeline.train.checkpointing import TrainingError
from pipeline.workdir import TrainRun

log = logging.getLogger(__name__)


def stop_message(count: int, files: list[str], learning_rate: float, step: int) -> str:
    """The one-line error of a stop after ``count`` non-finite batches in a row, the last at ``step``."""
    return (
        f"{count} batches in a row had a non-finite loss (last files: {', '.join(files)}); check these files "
        f"and the learning rate (training.learning_rate {learning_rate}); the run stays stopped at step "
        f"{step}: raise training.max_nonfinite_batches above {count} to train on past them, or start it "
        f"over (make rerun STAGE=Train)"
    )


def record_stop(run: TrainRun, limit: int, step: int, message: str) -> None:
    """Record (chief only) that the run stopped at ``step`` on reaching ``limit``, with its ``message``."""
    run.root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run.nonfinite_stop, {"max_nonfinite_batches": limit, "step": step, "message": message})


def check_not_stopped(run: TrainRun, limit: int, is_chief: bool) -> None:
    """Before a run restores anything: TrainingError with the recorded stop's own line when the run was
    stopped by ``training.max_nonfinite_batches`` and ``limit`` (the setting now) is not above the limit it
    reached; when it is, training goes on (a warning) and the chief removes the record."""
    path = run.nonfinite_stop
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except OSError as error:
        raise TrainingError(f"{path}: cannot read this record of a non-finite stop ({error})") from None
    try:
        record = json.loads(text)
        reached, step, message = int(record["max_nonfinite_batches"]), int(record["step"]), record["message"]
    except (ValueError, KeyError, TypeError) as error:
        raise TrainingError(
            f"{path}: a damaged record of a non-finite stop ({type(error).__name__}: {error}); delete the "
            f"file to train on"
        ) from None
    if limit <= reached:
        raise TrainingError(str(message))
    log.warning(
        "training.max_nonfinite_batches is %d, above the %d that stopped this run at step %d: training "
        "goes on",
        limit,
        reached,
        step,
    )
    if is_chief:
        path.unlink(missing_ok=True)
