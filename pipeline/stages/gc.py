"""``deepspeech-train gc --config a.yaml [--config b.yaml ...] [--dry-run]``: free the disk of old outputs.

Every changed setting leaves the outputs of the old fingerprints behind (a
features cache per fingerprint: 36 MiB per audio hour). ``gc`` walks each given
config's DAG (``pipeline.dag``) from its roots, asks the layout for the
outputs of every stage instance it reaches, and removes every other entry of the
fingerprinted stage directories (imports, alphabet, features, train, lm, tune,
evaluate) of the configs' work directories. Never removed:

- what any given config reaches (and the lock files beside those outputs);
- an entry a live process holds locked (``pipeline.locks``: a running stage,
  on this machine or, through NFS locks, another);
- the export directory and its numbered versions (``paths.export_dir``), the
  shared converted audio (``imports/converted``), logs and luigid's state;
- hidden entries (a running or killed writer's temporary files: the stage that
  owns them removes its own leftovers when it runs).

A config that cannot be resolved (a corpus folder missing, a bad key) stops gc
with its one-line error before anything is removed: what it reaches is unknown.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Config, ConfigError
from pipeline.config_loader import load_config
from pipeline.dag import Node, upstream
from pipeline.layout import Layout
from pipeline.locks import held, in_use
from pipeline.workdir import (
    ALPHABET_DIR,
    CONVERTED_DIR,
    EVALUATE_DIR,
    FEATURES_DIR,
    IMPORT_DIR,
    LM_DIR,
    TRAIN_DIR,
    TUNE_DIR,
)

STAGE_DIRS = (IMPORT_DIR, ALPHABET_DIR, FEATURES_DIR, TRAIN_DIR, LM_DIR, TUNE_DIR, EVALUATE_DIR)
# The DAG's roots: every stage a config runs is upstream of one of them.
ROOTS: tuple[Node, ...] = (("evaluate", {}), ("export", {}), ("tune", {}))


@dataclass(frozen=True)
class Entry:
    """One entry of a stage directory that no given config reaches, its size, and the lock by which a
    live process holds it (None: free to remove)."""

    path: Path
    size: int
    lock: Path | None = None


def reached_nodes(config: Config) -> list[Node]:
    """Every stage instance the config's DAG reaches from its roots (``ROOTS``)."""
    seen: dict[str, Node] = {}
    todo = list(ROOTS)
    while todo:
        name, params = todo.pop()
        key = f"{name}{sorted(params.items())}"
        if key in seen:
            continue
        seen[key] = (name, params)
        todo.extend(upstream(config, name, params))
    return list(seen.values())


def node_outputs(layout: Layout, name: str, params: dict) -> list[Path]:
    """The paths a stage instance writes in the fingerprinted stage directories (none for Export and
    Transcribe, which gc never touches)."""
    if name == "import":
        return [layout.import_files(params["corpus"]).root]
    if name == "alphabet":
        return [layout.alphabet_files.root]
    if name == "features":
        split = params["split"]
        return [layout.features_cache(split), layout.rejects_report(split), layout.features_parts(split)]
    if name == "train":
        return [layout.train_run.root]
    if name == "lm":
        return [layout.lm.root, layout.lm.staging]
    if name == "tune":
        return [layout.tune_dir]
    if name == "evaluate":
        return [layout.evaluate_dir]
    return []


def reached_outputs(configs: list[Config]) -> tuple[set[Path], set[Path]]:
    """(the outputs the configs reach, their work directories)."""
    reached, work_dirs = set(), set()
    for config in configs:
        layout = Layout(config)
        work_dirs.add(layout.work_dir)
        for name, params in reached_nodes(config):
            reached.update(node_outputs(layout, name, params))
    return reached, work_dirs


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).lstat().st_size
            except OSError:
                pass
    return total


def unreachable(configs: list[Config]) -> list[Entry]:
    """Every entry of the configs' stage directories none of them reaches, in path order."""
    reached, work_dirs = reached_outputs(configs)
    # an output's lock file beside it (pipeline.locks.lock_path) belongs to the output
    kept = reached | {path.with_name(path.name + ".lock") for path in reached}
    found = []
    for work_dir in sorted(work_dirs):
        for stage_dir in STAGE_DIRS:
            folder = work_dir / stage_dir
            if not folder.is_dir():
                continue
            for entry in sorted(folder.iterdir()):
                if entry in kept or entry.name.startswith("."):
                    continue
                if stage_dir == IMPORT_DIR and entry.name == CONVERTED_DIR:
                    continue
                is_lock = entry.name.endswith(".lock") and entry.is_file()
                lock = (entry if held(entry) else None) if is_lock else in_use(entry)
                found.append(Entry(entry, _size(entry), lock))
    # The files of one stage instance share the name before the first dot (``dev-<fp>.h5``, its
    # ``.rejects.csv``, ``.parts`` and ``.h5.lock``; ``lm/<fp>`` and ``<fp>.partial``): a lock held on
    # one of them keeps them all.
    held_by = {_owner(entry.path): entry.lock for entry in found if entry.lock is not None}
    return [Entry(e.path, e.size, e.lock or held_by.get(_owner(e.path))) for e in found]


def _owner(path: Path) -> tuple[Path, str]:
    return path.parent, path.name.split(".", 1)[0]


def remove(path: Path) -> None:
    """Remove a file or directory, renamed to a hidden name first so that no reader sees it half gone."""
    doomed = path.with_name(f".{path.name}.removed-{os.getpid()}")
    os.replace(path, doomed)
    if doomed.is_dir() and not doomed.is_symlink():
        shutil.rmtree(doomed)
    else:
        doomed.unlink()


def human(size: int) -> str:
    """A byte count as people read it (KiB, MiB, GiB)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def main(argv=None) -> int:
    """List (``--dry-run``) or remove what no given config reaches; exit 2 on a config that cannot be
    resolved (nothing removed)."""
    parser = argparse.ArgumentParser(prog="deepspeech-train gc", description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", required=True, help="a config whose outputs are kept")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    args = parser.parse_args(argv)
    try:
        entries = unreachable([load_config(path) for path in args.config])
    except ConfigError as error:
        print(f"error: {error} (gc removed nothing)", file=sys.stderr)
        return 2
    freed = 0
    for entry in entries:
        if entry.lock is not None:
            print(f"kept {entry.path}: in use by a running stage (it holds {entry.lock})")
            continue
        print(
            f"{'would remove' if args.dry_run else 'removing'} {entry.path} ({human(entry.size)})", flush=True
        )
        if not args.dry_run:
            remove(entry.path)
        freed += entry.size
    count = sum(1 for entry in entries if entry.lock is None)
    verb = "would free" if args.dry_run else "freed"
    print(f"{count} unreachable outputs; {verb} {human(freed)} ({freed} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
