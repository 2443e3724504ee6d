"""Update windows (``training.accumulate_batches``): which steps add into one optimizer update, and how
much each task's batch weighs in it. Plain numbers from the batch plans, known before a window starts.

A window is N consecutive steps. Its gradient is that of one step over all of its batches: each task's
per-utterance mean loss is taken over all of its utterances in the window and weighted by the share of
the window's steps that drew the task. With one task that is the loss averaged per utterance over the
whole window, as one step averages it over its batch. In numbers: in a window of N steps that each draw
m tasks, the batch of task t adds ``factor_t * k_t / (N * m * U_t)`` times its summed per-utterance loss,
where k_t is how many of the window's steps drew t and U_t is t's utterances in the window.

A single-task run's windows are its plan's (``pipeline.batches.dataset.epoch_windows``: consecutive plan
steps, the windows shuffled, the last one of a plan may be shorter); a multi-task run's are N consecutive
steps of the epoch's task schedule (``pipeline.batches.tasks``), the epoch's last one maybe shorter.
A window never spans two epochs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.batches.dataset import epoch_windows
from pipeline.train.checkpointing import TrainingError


@dataclass(frozen=True)
class Windows:
    """The update windows of one epoch. For each step (in order): the loss coefficient of each of its
    tasks' batches (in the step's task order), its share of its window's loss (a window's shares sum to 1:
    what is left when a step is skipped); and the steps after which a window ends (counted from 1)."""

    coefficients: tuple[tuple[float, ...], ...]
    shares: tuple[float, ...]
    ends: frozenset[int]


def loss_factors(weights: Sequence[float]) -> list[float]:
    """Each task's loss factor: its weight over the tasks' mean weight (equal weights: all 1)."""
    mean = sum(weights) / len(weights)
    return [w / mean for w in weights]


def task_windows(
    schedule: Sequence[tuple[int, ...]],
    first_draws: Sequence[int],
    batch_utterances: Callable[[int, int], int],
    factors: Sequence[float],
    lengths: Sequence[int],
) -> Windows:
    """The windows of an epoch whose steps draw the tasks of ``schedule``, cut into windows of
    ``lengths`` steps; each task starts at its draw ``first_draws[t]``, ``batch_utterances(t, d)`` is the
    utterance count of task t's draw d, ``factors`` the tasks' loss factors (``loss_factors``)."""
    draws = list(first_draws)
    coefficients, shares, ends, start = [], [], set(), 0
    for length in lengths:
        steps = schedule[start : start + length]
        sizes = []
        for tasks in steps:
            sizes.append([batch_utterances(t, draws[t]) for t in tasks])
            for t in tasks:
                draws[t] += 1
        drawn = Counter(t for tasks in steps for t in tasks)
        utterances = Counter()
        for tasks, counts in zip(steps, sizes, strict=True):
            utterances.update(dict(zip(tasks, counts, strict=True)))
        masses = []
        for tasks, counts in zip(steps, sizes, strict=True):
            each = tuple(factors[t] * drawn[t] / (len(steps) * len(tasks) * utterances[t]) for t in tasks)
            coefficients.append(each)
            masses.append(sum(c * u for c, u in zip(each, counts, strict=True)))
        shares.extend(mass / sum(masses) for mass in masses)
        start += length
        ends.add(start)
    return Windows(tuple(coefficients), tuple(shares), frozenset(ends))


def schedule_lengths(steps: int, accumulate: int) -> list[int]:
    """A multi-task epoch of ``steps`` steps cut into windows of ``accumulate`` (the last may be shorter)."""
    return [min(accumulate, steps - start) for start in range(0, steps, accumulate)]


def plan_windows(plan: list[np.ndarray], epoch: int, seed: int, accumulate: int) -> Windows:
    """The windows of a single-task epoch over ``plan``, in the order ``epoch_windows`` gives it."""
    windows = epoch_windows(len(plan), epoch, seed, accumulate)
    order = [i for window in windows for i in window]
    return task_windows(
        [(0,)] * len(order), [0], lambda _, draw: len(plan[order[draw]]), [1.0], [len(w) for w in windows]
    )


def check_window_start(epoch: int, step_in_epoch: int, ends, accumulate: int) -> None:
    """TrainingError when a run's position (``step_in_epoch`` of ``epoch``) is not between two of the
    epoch's windows (``ends``: the steps after which one ends): checkpoints are only saved there, so such a
    position comes from another batch plan."""
    if step_in_epoch and step_in_epoch not in ends:
        raise TrainingError(
            f"the run's position, step {step_in_epoch} of epoch {epoch + 1}, is inside an update window "
            f"of training.accumulate_batches {accumulate}; checkpoints are only saved between "
            f"windows, so this one comes from another batch plan: delete the run (make rerun STAGE=Train)"
        )
