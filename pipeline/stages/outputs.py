"""What a stage instance writes and reads in the work directory's stage directories, as ``gc`` and the
stages' read locks see it.

A stage instance writes its outputs under the lock of its first one (``locks.stage_lock``); a stage that
reads them holds the same lock file shared (``locks.shared_locks``) for as long as it runs, so ``gc`` and
``make rerun``, which remove only what they can lock exclusively, never take an input from under a
running stage. The files a config names itself (``paths.alphabet``, ``training.init_from``, LM text...)
may lie in a stage directory too: they are kept by ``gc`` like what the DAG reaches.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from pipeline.config import Config
from pipeline.dag import stage, stages, upstream
from pipeline.features.cache import CacheIndex, read_cache
from pipeline.layout import Layout
from pipeline.locks import lock_path
from pipeline.workdir import TRAIN_DIR

# Path keys that name where the pipeline writes, not what it reads.
_OUTPUT_KEYS = {("paths", "work_dir"), ("paths", "export_dir")}


def split_cache(layout: Layout, split: str) -> CacheIndex:
    """The index of ``split``'s feature cache as a stage reads it (``read_cache``: its settings checked
    against the config's)."""
    return read_cache(layout.features_cache(split), layout.config.features)


def node_outputs(layout: Layout, name: str, params: dict) -> list[Path]:
    """The paths a stage instance writes in the fingerprinted stage directories, the one its writer locks
    first (its declaration's ``outputs``; none for Export and Transcribe, which gc never touches)."""
    return stage(name).outputs(layout.for_task(params.get("task", "")), params)


def stage_dirs() -> tuple[str, ...]:
    """The folders of a work directory the stages write in (their declarations' ``directory``)."""
    return tuple(declared.directory for declared in stages().values() if declared.directory)


def _field_paths(f: dataclasses.Field, value) -> list[str]:
    """The paths a config field holds: its value when it is a path key (every item of a list), and
    those of the entries it holds (a corpus of ``data.corpora``), recursively."""
    found = []
    for item in value if isinstance(value, tuple) else (value,):
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            for inner in dataclasses.fields(item):
                found += _field_paths(inner, getattr(item, inner.name))
        elif f.metadata.get("path") and isinstance(item, str) and item:
            if item not in f.metadata.get("keywords", ()):
                found.append(item)
    return found


def config_inputs(config: Config) -> list[Path]:
    """Every file or folder a config names as an input (every path key but the work and export
    directories), of each of its tasks too."""
    found: set[Path] = set()
    for view in [config, *(config.task_view(name) for name in config.tasks)]:
        for section_field in dataclasses.fields(view):
            section = getattr(view, section_field.name)
            if not dataclasses.is_dataclass(section):
                continue
            for f in dataclasses.fields(section):
                if (section_field.name, f.name) not in _OUTPUT_KEYS:
                    found.update(Path(p) for p in _field_paths(f, getattr(section, f.name)))
    return sorted(found)


def stage_entries(path: str | Path) -> list[Path]:
    """The stage-directory entries that hold ``path``, as spelled and as resolved (a symlink in a stage
    directory keeps both itself and its target): for each, the ancestor whose parent is named like a
    stage directory (``<wd>/train/<fp>`` for ``<wd>/train/<fp>/best/ckpt-12``), its parent resolved."""
    found = []
    for spelled in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
        for ancestor in (spelled, *spelled.parents):
            if ancestor.parent.name in stage_dirs():
                found.append(Path(os.path.realpath(ancestor.parent)) / ancestor.name)
                break
    return found


def read_locks(layout: Layout, name: str, params: dict) -> list[Path]:
    """The lock files of the upstream outputs a running instance of stage ``name`` reads
    (``pipeline.dag.upstream``), which it holds shared while it runs."""
    locks = []
    for node, node_params in upstream(layout.config, name, params):
        outputs = node_outputs(layout, node, node_params)
        if outputs:
            locks.append(lock_path(outputs[0]))
    return sorted(set(locks))


def warm_start_lock(layout: Layout, name: str) -> Path | None:
    """The lock file of the Train run (of any work directory) that Train's ``training.init_from`` names,
    which Train holds shared while it runs; None for another stage or a model file outside a run."""
    if name != "train" or not layout.config.training.init_from:
        return None
    for entry in stage_entries(layout.config.training.init_from):
        if entry.parent.name == TRAIN_DIR and re.fullmatch(r"[0-9a-f]{12}", entry.name):
            return lock_path(entry)
    return None
