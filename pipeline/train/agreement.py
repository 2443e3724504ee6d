"""With several workers, the chief's after-epoch decisions hold on every worker.

Each worker validates its own copy of the model, and on a GPU (not deterministic) two copies' dev
figures can differ by a rounding: a near tie read two ways would give the workers different learning
rates (the mirrored weights then drift apart silently), or make one worker save a best checkpoint, a
collective the others never join, or stop while the others wait. So the chief's verdict travels in one
all-reduce (the other workers add zeros), as its save vote does in the step.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import tensorflow as tf

from pipeline.reports import StopRecord
from pipeline.train.distribute import ClusterRole, sum_over_workers
from pipeline.train.policy import EpochVerdict

log = logging.getLogger(__name__)

# The early-stop rules a verdict's stop can come from, by their code in the all-reduce (0: no stop).
_RULES = ("seed", "patience")


def chiefs_verdict(strategy: tf.distribute.Strategy, role: ClusterRole, verdict: EpochVerdict, epoch: int):
    """``verdict`` with the chief's ``is_best``, ``halve_lr`` and early stop; every worker (``role``) calls it
    after the same validation (epoch ``epoch``, 1-based). This worker's own figures stay in it."""
    stop = verdict.stop
    code = _RULES.index(stop.rule) + 1 if stop is not None and stop.rule in _RULES else 0
    mine = [float(verdict.is_best), float(verdict.halve_lr), float(code)] if role.is_chief else [0.0] * 3
    summed = sum_over_workers(strategy, role.count, mine)
    is_best, halve, code = (round(v) for v in summed)
    if not code:
        agreed_stop = None
    elif stop is not None and stop.rule == _RULES[code - 1]:
        agreed_stop = stop
    else:
        rule = _RULES[code - 1]
        agreed_stop = StopRecord(rule=rule, reason=f"the chief's {rule} rule stopped training", epoch=epoch)
    agreed = replace(verdict, is_best=bool(is_best), halve_lr=bool(halve), stop=agreed_stop)
    if (agreed.is_best, agreed.halve_lr, agreed.stop is None) != (
        verdict.is_best,
        verdict.halve_lr,
        verdict.stop is None,
    ):
        log.info("Epoch %d: this worker's dev figures decided otherwise; the chief's decision holds", epoch)
    return agreed
