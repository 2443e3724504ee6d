"""Stopping training on a signal: at the end of a step, with a checkpoint of it, in every process that trains.

SIGTERM (Luigi's worker stopping its task processes, Slurm's time limit or preemption, a container
stopping), SIGINT (Ctrl-C) and SIGHUP ask the training process for a stop at the end of its current step
(``SignalStop``, a step hook), where the trainer saves before it stops; with several workers the stop is
agreed in the steps' all-reduce, so that all stop after the same step (``pipeline.train.loop``). The same
signal again acts at once, as it would have.

A process that started the training processes passes the request on to them with ``PASSED_ON`` and waits
for them: the launcher of the workers (``pipeline.train.multiworker``), and ``deepspeech-train``, whose
Luigi worker runs each task in a process of its own. Not with the signal it got: a process may get the
signal itself too (Slurm signals every process of a job step; Ctrl-C reaches the terminal's whole process
group), and twice the same signal would mean "at once". ``PASSED_ON`` is the same request: received with
the original signal it is still one request; received a second time (its sender got its own signal twice),
it too acts at once.

With several workers a stop is a vote (``stop_vote``): every worker stops after the step the vote reached
them all in, those that were not asked too (``stopped_with_the_others``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator

from pipeline.train.hooks import StepInfo, StopTraining

log = logging.getLogger(__name__)

# The signals that ask training to stop at the end of its step.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The signal a process passes that request on to the processes it started with (see the module's text).
PASSED_ON = signal.SIGUSR2
# The exit status of a training worker (``pipeline.stages.train_worker``) that stopped on request, after the
# step every worker stopped after, with a checkpoint of it.
STOPPED = 4


def signal_name(number: int) -> str:
    """How the log and the stop's message name signal ``number``."""
    if number == PASSED_ON:
        return f"{signal.Signals(number).name} (a stop passed on by the process that started this one)"
    return signal.Signals(number).name


class SignalStop:
    """A request, made by a signal, that training stop at the end of the current step: of the current
    update window with ``training.accumulate_batches`` (``accumulate``) above 1, as checkpoints are saved
    between windows only."""

    def __init__(self, accumulate: int = 1) -> None:
        self.requested = ""  # the signal that asked training to stop
        self.accumulate = accumulate

    def when(self) -> str:
        """When the stop comes, as the log says it."""
        if self.accumulate > 1:
            more = self.accumulate - 1
            return (
                f"at the end of this update window (up to {more} more batch{'es' if more > 1 else ''}: "
                f"training.accumulate_batches {self.accumulate})"
            )
        return "after this step"

    def check(self, info: StepInfo) -> None:
        """A step's hook: raises StopTraining (the trainer saves first) when a signal asked to stop."""
        if self.requested:
            raise StopTraining(
                f"training stopped by {self.requested} after step {info.step}; a checkpoint of that "
                f"step was saved: run Train again to resume"
            )


@contextlib.contextmanager
def stop_on_signals(stop: SignalStop, pass_on: Callable[[], None] | None = None) -> Iterator[None]:
    """While training (or waiting for the processes that train): ``STOP_SIGNALS`` and ``PASSED_ON`` ask for a
    stop at the end of the current step (``stop.requested``), where the trainer saves a checkpoint
    (``StopTraining``) before the task exits, instead of dying with everything since the last checkpoint.
    The same signal again acts at once, as it would have. ``pass_on`` is called on the first request, and
    again before a signal acts at once: a launcher passes the stop on to its workers with it
    (``pass_stop_on``). Only in the main thread (signals cannot be set elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = (*STOP_SIGNALS, PASSED_ON)
    seen = set()

    def request(number, frame):
        name, short = signal_name(number), signal.Signals(number).name
        again = number in seen
        seen.add(number)
        if pass_on is not None and (again or len(seen) == 1):
            pass_on()
        if again:  # asked twice: do what the signal would have done
            signal.signal(number, previous[number])
            signal.raise_signal(number)
            return
        if stop.requested:
            log.warning("%s: training already stops %s (%s again: at once)", name, stop.when(), short)
            return
        stop.requested = name
        log.warning("%s: training stops %s, with a checkpoint (%s again: at once)", name, stop.when(), short)

    previous = {number: signal.getsignal(number) or signal.SIG_DFL for number in numbers}
    for number in numbers:
        signal.signal(number, request)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def pass_stop_on(processes: Iterable[subprocess.Popen]) -> None:
    """Send ``PASSED_ON`` to each of ``processes`` still running (from a signal handler: never raises)."""
    for process in processes:
        if process.returncode is None:
            with contextlib.suppress(OSError):
                os.kill(process.pid, PASSED_ON)


def stop_vote(request: StopTraining, asked: StopTraining | None, step: int) -> StopTraining:
    """A worker of several was asked to stop (``request``) after global step ``step``: its vote in every
    step from the next one on (``asked``: the request it votes for already, None), until all stop after
    the step the vote reached them in (``pipeline.train.step.StepResult.stop``)."""
    if asked is None:
        log.warning(
            "Asked to stop after step %d: every worker stops after the next step, with a checkpoint", step
        )
    return request


def stopped_with_the_others(step: int) -> StopTraining:
    """The stop of a worker that was not asked to stop itself, after another one was, after ``step``."""
    return StopTraining(
        f"training stopped after step {step} as another worker was asked to; a checkpoint of that step "
        "was saved: run Train again to resume"
    )
