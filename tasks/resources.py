"""What each task takes of the machine, as Luigi ``resources``: ``gpu`` towers and a ``cpu`` share.

The scheduler (luigid, or the local one) runs a task only while the sums of the
``resources`` of the tasks running stay within its ``[resources]`` section
(luigi.cfg ships ``gpu = 1`` and ``cpu = 4``), so ``--workers N`` runs independent
stages at once without two trainings landing on one GPU or two feature
extractions oversubscribing the cores.

A resource Luigi's scheduler does not know counts as 1 there, and a task needing
more than the scheduler has would never run (its worker waits forever): each
amount is capped at what the scheduler the tasks run on grants (``scheduler_totals``):
luigid's own ``[resources]``, asked over its RPC (``resource_list``), which need
not be this machine's luigi.cfg; the local scheduler's, read from luigi.cfg as it
reads them. What is still more than the scheduler grants (a total of 0) is
refused before anything runs (``ungrantable``), in one line, instead of a wait.
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
    model stage when GPUs are visible; every amount at least 1 and at most ``totals`` (the scheduler's
    ``[resources]``, see ``scheduler_totals``)."""
    gpus = visible_gpus() if gpus is None else gpus
    wanted = {"cpu": processes(config, stage, os.cpu_count() or 1)}
    if stage in MODEL_STAGES and towers(config, gpus):
        wanted["gpu"] = towers(config, gpus)
    return {name: max(1, min(amount, totals.get(name, 1))) for name, amount in wanted.items()}


# Set by deepspeech-train (tasks.cli) for its tasks: the [resources] of the scheduler they run on (JSON).
TOTALS_VARIABLE = "DEEPSPEECH_SCHEDULER_RESOURCES"
# luigid's totals by its URL, asked once per process.
_REMOTE: dict[str, dict[str, int] | None] = {}


def remote_totals(url: str) -> dict[str, int] | None:
    """The ``[resources]`` luigid at ``url`` grants (its RPC ``resource_list``: each resource's
    ``num_total``); None when it does not answer (asked once per process)."""
    if url not in _REMOTE:
        from luigi.rpc import RemoteScheduler

        scheduler = RemoteScheduler(url)
        try:
            listed = scheduler.resource_list()
            _REMOTE[url] = {item["name"]: int(item["num_total"]) for item in listed or []}
        except Exception:  # noqa: BLE001 - whatever the RPC client raises: Luigi reports an absent scheduler
            _REMOTE[url] = None
        finally:
            scheduler.close()
    return _REMOTE[url]


def scheduler_url(host: str, port: int) -> str:
    """The URL of luigid at ``host:port``, as Luigi builds it."""
    return f"http://{host}:{port:d}/"


def scheduler_totals() -> dict[str, int]:
    """The ``[resources]`` of the scheduler this process's tasks run on (a resource it does not name counts
    as 1 there, as in ``stage_resources``): what deepspeech-train found on it (``TOTALS_VARIABLE``); under
    ``luigi --module tasks`` on luigid, luigid's (``remote_totals``); else luigi.cfg's as Luigi's local
    scheduler reads them (``getintdict``)."""
    import json

    import luigi.configuration

    given = os.environ.get(TOTALS_VARIABLE)
    if given:
        try:
            return {str(name): int(amount) for name, amount in json.loads(given).items()}
        except (ValueError, AttributeError, TypeError):
            pass
    from luigi.cmdline_parser import CmdlineParser

    if CmdlineParser.get_instance() is not None:  # a Luigi command line: its own scheduler options
        import luigi.interface

        core = luigi.interface.core()
        if not core.local_scheduler:
            url = core.scheduler_url or scheduler_url(core.scheduler_host, core.scheduler_port)
            found = remote_totals(url)
            if found is not None:
                return found
    return dict(luigi.configuration.get_config().getintdict("resources"))


def ungrantable(tasks, totals: dict[str, int], where: str) -> str | None:
    """The first of ``tasks`` (Luigi tasks) whose ``resources`` the scheduler ``where``, granting
    ``totals``, can never grant, as one line; None when it can grant each (perhaps after a wait)."""
    for task in tasks:
        for name, amount in sorted(task.process_resources().items()):
            granted = totals.get(name, 1)
            if amount > granted:
                return (
                    f"{task.task_family} asks {name} {amount} and the scheduler at {where} grants {name} "
                    f"{granted} (its luigi.cfg's [resources]), so it would never run: raise {name} there "
                    f"(and restart it), or run with --local-scheduler"
                )
    return None
