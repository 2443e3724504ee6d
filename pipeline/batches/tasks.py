"""The order of a multi-task run's steps (``multitask.sampling``): which tasks each step draws a batch from.

Each task has its own batch plan (``dataset.batch_plan`` over its train split) and goes round it in an
order shuffled per round, as a single-task run goes round its plan once per epoch. A step draws the next
batch of each task it holds:

- ``proportional``: a step holds one task; an epoch is every batch of every task once, the tasks' turns
  shuffled with ``seed + epoch``, so each task is drawn in proportion to its number of batches and goes
  round its plan exactly once per epoch;
- ``round_robin``: a step holds every task (nabu's trainers: a batch per task, their losses combined in
  one update); an epoch is as many steps as the largest task has batches, a smaller task starting its
  plan again (newly shuffled) whenever it has gone round it.

Both are functions of the epoch alone, so a run resumed at (epoch, step) draws what it would have.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

SAMPLINGS = ("proportional", "round_robin")


def steps_per_epoch(sampling: str, batches: Sequence[int]) -> int:
    """Steps of an epoch for tasks of ``batches`` batches each."""
    return int(sum(batches)) if sampling == "proportional" else int(max(batches))


def task_batches_per_epoch(sampling: str, batches: Sequence[int], index: int) -> int:
    """How many batches of task ``index`` an epoch draws."""
    return int(batches[index]) if sampling == "proportional" else int(max(batches))


def epoch_tasks(sampling: str, batches: Sequence[int], epoch: int, seed: int) -> list[tuple[int, ...]]:
    """The tasks (indices, in task order) each step of ``epoch`` draws a batch from."""
    if sampling == "round_robin":
        return [tuple(range(len(batches)))] * steps_per_epoch(sampling, batches)
    turns = np.repeat(np.arange(len(batches)), batches)
    return [(int(task),) for task in np.random.default_rng(seed + epoch).permutation(turns)]


def tasks_digest(sampling: str, digests: Sequence[int]) -> int:
    """A 63-bit digest of the tasks' batch plans (``dataset.plan_digest`` of each) and the sampling: the
    checkpoint's batch-plan check for a multi-task run."""
    text = sampling + ":" + ",".join(str(d) for d in digests)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1
