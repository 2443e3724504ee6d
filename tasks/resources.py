"""What each task takes of the machine, as Luigi ``resources``: ``gpu`` towers and a ``cpu`` share.

The scheduler (luigid, or the local one) runs a task only while the sums of the
``resources`` of the tasks running stay within its ``[resources]`` section
(luigi.cfg ships ``gpu = 1`` and ``cpu = 4``), so ``--workers N`` runs independent
stages at once without two trainings landing on one GPU or two feature
extractions oversubscribing the cores.

A resource Luigi's scheduler does not know counts as 1 there, and a task needing
more than the scheduler has would never run (its worker waits forever): each
amount is capped at what luigi.cfg's ``[resources]`` grants, read here as the
scheduler reads it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pipeline.config import Config

# Stages that run the acoustic model (on the GPU when there is one).
MODEL_STAGES = ("train", "tune", "evaluate", "export", "transcribe")


def visible_gpus(environ: dict | None = None) -> int:
    """The NVIDIA GPUs this process may use, counted without starting TensorFlow: ``CUDA_VISIBLE_DEVICES``
    when it is set (``""`` or ``-1``: none), else the ``/dev/nvidiaN`` devices."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [item.strip() for item in visible.split(",") if item.strip()]
        return 0 if not ids or ids[0] == "-1" else len(ids)
    return sum(1 for device in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", device.name))


def towers(config: Config, gpus: int) -> int:
    """GPUs a model stage of ``config`` uses when ``gpus`` are visible: one with ``distribution.strategy:
    one_device``, all of them otherwise (mirrored, auto, and a multi-worker process's local towers)."""
    if gpus <= 0:
        return 0
    return 1 if config.distribution.strategy == "one_device" else gpus


def processes(config: Config, stage: str, cores: int) -> int:
    """Worker processes ``stage`` runs at once: ``features.workers`` for Features and Phonemes (espeak-ng
    processes), ``decoder.workers`` for TuneDecoder and Evaluate (0 = one per core),
    ``distribution.local_workers`` for Train; else 1."""
    wanted = {
        "features": config.features.workers,
        "phonemes": config.features.workers,
        "tune": config.decoder.workers,
        "evaluate": config.decoder.workers,
    }.get(stage)
    if wanted is not None:
        return wanted or cores
    if stage == "train" and config.distribution.local_workers:
        return config.distribution.local_workers
    return 1


def stage_resources(config: Config, stage: str, totals: dict[str, int], gpus: int | None = None) -> dict:
    """The Luigi ``resources`` of one stage of ``config``: ``{"cpu": n}`` plus ``{"gpu": towers}`` for a
    model stage when GPUs are visible; every amount at least 1 and at most ``totals`` (luigi.cfg's
    ``[resources]``, see ``scheduler_totals``)."""
    gpus = visible_gpus() if gpus is None else gpus
    wanted = {"cpu": processes(config, stage, os.cpu_count() or 1)}
    if stage in MODEL_STAGES and towers(config, gpus):
        wanted["gpu"] = towers(config, gpus)
    return {name: max(1, min(amount, totals.get(name, 1))) for name, amount in wanted.items()}


def scheduler_totals() -> dict[str, int]:
    """luigi.cfg's ``[resources]`` as Luigi's scheduler reads it (``getintdict``); a resource it does not
    name counts as 1 there, as in ``stage_resources``."""
    import luigi.configuration

    return dict(luigi.configuration.get_config().getintdict("resources"))
