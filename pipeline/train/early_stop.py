"""Early-stopping rules over the history of dev losses; each decision says why."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import EarlyStopConfig


@dataclass(frozen=True)
class StopDecision:
    """Whether to stop, which rule decided, and the numbers it used."""

    stop: bool
    rule: str
    reason: str


def seed_rule(losses: list[float], config: EarlyStopConfig) -> StopDecision:
    """DeepSpeech's rule: with ``earlystop_nsteps`` dev losses, stop if the latest exceeds the max
    of the previous ones, or if it is within ``estop_mean_thresh`` of their mean while their std is
    below ``estop_std_thresh``."""
    window = losses[-config.earlystop_nsteps :]
    if len(window) < config.earlystop_nsteps:
        return StopDecision(False, "seed", f"{len(window)} of {config.earlystop_nsteps} dev losses so far")
    latest, previous = window[-1], np.array(window[:-1])
    mean, std, highest = float(previous.mean()), float(previous.std()), float(previous.max())
    if latest > highest:
        return StopDecision(
            True,
            "seed",
            f"dev loss {latest:.4f} is above the max {highest:.4f} of the previous {len(previous)}",
        )
    if abs(latest - mean) < config.estop_mean_thresh and std < config.estop_std_thresh:
        return StopDecision(
            True,
            "seed",
            f"dev loss {latest:.4f} is within {config.estop_mean_thresh} of the previous mean "
            f"{mean:.4f} and their std {std:.4f} < {config.estop_std_thresh}",
        )
    return StopDecision(
        False, "seed", f"dev loss {latest:.4f}, previous mean {mean:.4f}, std {std:.4f}, max {highest:.4f}"
    )


def patience_rule(losses: list[float], config: EarlyStopConfig) -> StopDecision:
    """Stop when none of the last ``es_epochs`` validations improved on the best before them
    by more than ``es_min_delta``."""
    if len(losses) <= config.es_epochs:
        return StopDecision(False, "patience", f"{len(losses)} validations, patience {config.es_epochs}")
    best_before = min(losses[: -config.es_epochs])
    recent_best = min(losses[-config.es_epochs :])
    if recent_best > best_before - config.es_min_delta:
        return StopDecision(
            True,
            "patience",
            f"no dev loss in the last {config.es_epochs} validations improved on "
            f"{best_before:.4f} by more than {config.es_min_delta} (best since: {recent_best:.4f})",
        )
    return StopDecision(
        False, "patience", f"best recent dev loss {recent_best:.4f} improves on {best_before:.4f}"
    )


def should_stop(losses: list[float], config: EarlyStopConfig) -> StopDecision | None:
    """The decision of the configured rule, or None when early stopping is off."""
    if config.rule == "off":
        return None
    return (seed_rule if config.rule == "seed" else patience_rule)(list(losses), config)
