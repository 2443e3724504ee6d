"""``deepspeech-train gc --config a.yaml [--config b.yaml ...] [--dry-run] [--include-train]``: free the disk
of old outputs.

Every changed setting leaves the outputs of the old fingerprints behind (a
features cache per fingerprint: 36 MiB per audio hour). ``gc`` walks each given
config's DAG (``pipeline.dag``) from its roots, asks the layout for the
outputs of every stage instance it reaches, and removes every other entry of the
fingerprinted stage directories (the folders the stages declare: imports, align, clean, phonemes,
alphabet, features, train, lm, tune, evaluate) of the configs' work directories.
Never removed:

- what any given config reaches (and the lock files beside those outputs);
- Train runs (``train/``) unless ``--include-train`` is given: the default work
  directory is shared by every config, a trained model is the costliest output
  and a touched corpus file makes the only one unreachable; the listing says
  which runs it keeps. The same holds for the epoch-end weights a finished run
  the configs reach keeps for checkpoint averaging (``epoch_ends/``, written by
  Train with ``export.average``) that no given config's average wants (the key
  unset since, or a smaller N): listed as kept, removed with ``--include-train``
  while gc holds the run's lock (a run still training, or killed before its
  report, prunes its own as it goes on: so are the epochs past its report's,
  kept by a continued run killed before it wrote a new one);
- an entry a live process holds locked (``pipeline.locks``: a running stage,
  on this machine or, through NFS locks, another). The check made when listing
  is not trusted for the removal: each stage instance's entries are removed
  while gc holds their lock (``locks.try_locks``, without waiting; an entry it
  cannot lock is kept), and its lock file is removed last, still held
  (``locks.stage_lock`` then locks the file a starting stage makes anew, never
  the removed one, so two writers never hold "the" lock at once);
- the export directory and its numbered versions (``paths.export_dir``), the
  shared converted audio (``imports/converted``), logs and luigid's state;
- hidden entries (a running or killed writer's temporary files: the stage that
  owns them removes its own leftovers when it runs), except what a killed gc or
  ``make rerun`` was deleting (``.<name>.removed-<host>-<pid>``) when that
  process is gone, and the resume state of an Align no config reaches
  (``.<folder>.aligned``), removed under its folder's lock.

- the stage-directory entries holding a file a given config names itself (``paths.alphabet`` under
  ``alphabet/``, a ``training.init_from`` run under ``train/``: ``outputs.config_inputs``);
- the inputs of a running stage: it holds their lock files shared (``outputs.read_locks``), which gc's
  exclusive try fails on.

Work directories are compared by their canonical paths (``WorkDirs``: resolved, then by inode), so two
spellings of one are one, walked once. A stage directory that is a symlink is reported and never walked:
gc removes nothing outside a work directory. An entry it cannot remove is one line on standard error;
the rest still goes, and the exit status is 1.

A config that cannot be resolved (a corpus folder missing, a bad key) stops gc
with its one-line error before anything is removed: what it reaches is unknown.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Config, ConfigError
from pipeline.config_loader import load_config
from pipeline.dag import Node, pipeline_instances, upstream
from pipeline.files import remove_entry, writer_gone
from pipeline.layout import Layout
from pipeline.locks import held, in_use, lock_path, try_locks
from pipeline.model.averaged_epochs import epoch_end_number, wanted_epochs
from pipeline.reports import DevFigures, ReportError, TrainReport, read_report
from pipeline.stages.outputs import config_inputs, node_outputs, stage_dirs, stage_entries
from pipeline.workdir import (
    CONVERTED_DIR,
    IMPORT_DIR,
    REMOVED_PATTERN,
    TRAIN_DIR,
    TrainRun,
    resume_state_owner,
)


@dataclass(frozen=True)
class Entry:
    """One entry of a stage directory that no given config reaches, its size, and the lock by which a
    live process holds it (None: free to remove)."""

    path: Path
    size: int
    lock: Path | None = None


def reached_nodes(config: Config) -> list[Node]:
    """Every stage instance the config's DAG reaches: each one its pipeline has that takes no parameter
    but its task (``pipeline.dag.instances``: Evaluate, Export, ... of every task of a multi-task
    config), and what they read."""
    seen: dict[str, Node] = {}
    todo = pipeline_instances(config)
    while todo:
        name, params = todo.pop()
        key = f"{name}{sorted(params.items())}"
        if key in seen:
            continue
        seen[key] = (name, params)
        todo.extend(upstream(config, name, params))
    return list(seen.values())


class WorkDirs:
    """The directories gc walks, each by one canonical path: resolved (``..`` and symlinks followed) and,
    for two resolved paths of one directory (a bind mount), the first one met. So two configs that spell
    one work directory (or one stage directory, through a symlink) differently keep each other's
    outputs, and each directory is walked once."""

    def __init__(self):
        self._by_inode: dict[tuple[int, int], Path] = {}
        self.roots: set[Path] = set()

    def canonical(self, directory: Path) -> Path:
        """The canonical path of ``directory`` (which need not exist)."""
        real = Path(os.path.realpath(directory))
        try:
            info = real.stat()
        except OSError:
            return real
        return self._by_inode.setdefault((info.st_dev, info.st_ino), real)

    def add(self, work_dir: Path) -> Path:
        """The canonical path of ``work_dir``, now one of ``roots``."""
        root = self.canonical(work_dir)
        self.roots.add(root)
        return root

    def entry(self, path: Path) -> Path:
        """An entry of a stage directory by its canonical folder: ``canonical(parent) / name``."""
        return self.canonical(Path(path).parent) / Path(path).name


def reached_outputs(configs: list[Config]) -> tuple[WorkDirs, set[Path]]:
    """(the work directories, the outputs the configs reach and the stage-directory entries holding the
    files they name themselves), all by their canonical paths (``WorkDirs``)."""
    dirs, reached = WorkDirs(), set()
    for config in configs:
        layout = Layout(config)
        dirs.add(layout.work_dir)
        for name, params in reached_nodes(config):
            reached.update(dirs.entry(path) for path in node_outputs(layout, name, params))
        for path in config_inputs(config):
            reached.update(dirs.entry(entry) for entry in stage_entries(path))
    return dirs, reached


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


def unreachable(configs: list[Config], symlinks: list[Path] | None = None) -> list[Entry]:
    """Every entry of the configs' stage directories none of them reaches, in path order, with the
    entries a killed gc or rerun was deleting (their process gone). A stage directory that is a symlink
    is never walked (its entries lie outside the work directory): it is added to ``symlinks``."""
    dirs, reached = reached_outputs(configs)
    # an output's lock file beside it (pipeline.locks.lock_path) belongs to the output
    kept = reached | {path.with_name(path.name + ".lock") for path in reached}
    found = []
    for work_dir in sorted(dirs.roots):
        for stage_dir in stage_dirs():
            folder = work_dir / stage_dir
            if folder.is_symlink():  # its entries are elsewhere, maybe shared: never followed
                if symlinks is not None:
                    symlinks.append(folder)
                continue
            if not folder.is_dir():
                continue
            folder = dirs.canonical(folder)  # a bind mount's first spelling, as ``reached`` has it
            for entry in sorted(folder.iterdir()):
                if entry.name.startswith("."):
                    owner = resume_state_owner(entry)
                    if writer_gone(entry.name, REMOVED_PATTERN):
                        found.append(Entry(entry, _size(entry)))
                    elif owner is not None and entry not in kept and owner not in kept:
                        found.append(Entry(entry, _size(entry), in_use(owner)))  # an abandoned run's
                    continue
                if entry in kept or (stage_dir == IMPORT_DIR and entry.name == CONVERTED_DIR):
                    continue
                found.append(Entry(entry, _size(entry), _holder(entry)))
    # The files of one stage instance share the name before the first dot (``dev-<fp>.h5``, its
    # ``.rejects.csv``, ``.parts`` and ``.h5.lock``; ``lm/<fp>`` and ``<fp>.partial``): a lock held on
    # one of them keeps them all.
    held_by = {_owner(entry.path): entry.lock for entry in found if entry.lock is not None}
    return [Entry(e.path, e.size, e.lock or held_by.get(_owner(e.path))) for e in found]


def surplus_epoch_ends(configs: list[Config]) -> list[Entry]:
    """The files of kept epoch-end weights (``TrainRun.epoch_ends``) in the finished Train runs the configs
    reach (their ``train_report.json`` written and readable) that no config reaching that run averages
    (``export.average``: its wanted epochs by the run's report), in path order; each with the run's lock
    when a live process holds it. Epochs past the report's (a continued run killed before its new report)
    are never listed."""
    reports: dict[Path, TrainReport | None] = {}
    wanted: dict[Path, set[int]] = defaultdict(set)
    dirs = WorkDirs()
    for config in configs:
        layout = Layout(config)
        run = TrainRun(dirs.entry(layout.train_run.root))
        # gc removes nothing outside a work directory: not through a symlinked train/, run or epoch_ends/
        if not run.root.is_relative_to(dirs.add(layout.work_dir)) or run.root.is_symlink():
            continue
        if run.epoch_ends.is_symlink():
            continue
        if run.root not in reports:
            reports[run.root] = _finished(run)
        report = reports[run.root]
        if report is not None and config.export.average.count:
            validations = [DevFigures(**v) for v in report.validations]
            wanted[run.root].update(
                wanted_epochs(
                    config.export.average, validations, config.training.best_by, report.epochs_completed
                )
            )
    found = []
    for root, report in sorted(reports.items()):
        epoch_ends = TrainRun(root).epoch_ends
        if report is None or not epoch_ends.is_dir():
            continue
        lock = in_use(root)
        for path in sorted(epoch_ends.iterdir()):
            epoch = epoch_end_number(path)
            # An epoch past the report's was kept by a Train that continued the run (training.epochs
            # raised) and has not ended: that run prunes its own, the report knows nothing of its wants.
            if epoch is not None and epoch <= report.epochs_completed and epoch not in wanted[root]:
                found.append(Entry(path, path.lstat().st_size, lock))
    return found


def _finished(run: TrainRun) -> TrainReport | None:
    """The report of a run that has ended; None for one still training or killed before it (it prunes its
    own epoch ends as it goes on), and for a damaged report (nothing is trimmed on its word)."""
    if not run.report.is_file():
        return None
    try:
        return read_report(run.report, TrainReport)
    except ReportError:
        return None


def remove_epoch_ends(entries: list[Entry], say=lambda entry: None) -> bool:
    """Remove the epoch-end files ``entries`` of one Train run while holding the run's lock without waiting
    (the lock file stays: the run does); the index files first, so no half is ever found as weights.
    ``say(entry)`` before each removal. False (nothing removed) when a live process holds the lock."""
    run = entries[0].path.parent.parent
    with try_locks([lock_path(run)]) as taken:
        if not taken:
            return False
        for entry in sorted(entries, key=lambda e: not e.path.name.endswith(".index")):
            say(entry)
            entry.path.unlink(missing_ok=True)
    return True


def _is_lock(path: Path) -> bool:
    return path.name.endswith(".lock") and path.is_file() and not path.is_symlink()


def _holder(entry: Path) -> Path | None:
    return (entry if held(entry) else None) if _is_lock(entry) else in_use(entry)


def _owner(path: Path) -> tuple[Path, str]:
    path = resume_state_owner(path) or path  # a stage's resume state goes with its folder
    if path.name.startswith("."):  # a killed remover's entry: on its own
        return path.parent, path.name
    return path.parent, path.name.split(".", 1)[0]


def is_train_run(entry: Entry) -> bool:
    """Whether ``entry`` belongs to a Train run (kept unless ``--include-train``)."""
    return entry.path.parent.name == TRAIN_DIR and not entry.path.name.startswith(".")


def remove_group(entries: list[Entry], say=lambda entry: None) -> bool:
    """Remove the entries of one stage instance (one ``_owner``) while holding their lock without waiting:
    its lock files when there are some, else the lock file of each entry (made for the moment); a killed
    remover's hidden entry needs none. The lock files go last, still held. ``say(entry)`` is called
    before each removal. False (nothing removed) when a live process holds one of the locks."""
    paths = [entry.path for entry in entries if not entry.path.name.startswith(".")]
    # a stage's resume state is held by its folder's lock (the folder itself may be gone)
    paths += [owner for entry in entries if (owner := resume_state_owner(entry.path)) and owner not in paths]
    locks = [path for path in paths if _is_lock(path)] or [lock_path(path) for path in paths]
    with try_locks(locks) as taken:
        if not taken:
            return False
        for entry in entries:
            say(entry)
            if entry.path not in locks:
                remove_entry(entry.path)
        for lock in locks:
            lock.unlink(missing_ok=True)
    return True


def human(size: int) -> str:
    """A byte count as people read it (KiB, MiB, GiB)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _trim_epoch_ends(entries: list[Entry], dry_run: bool, include_train: bool) -> tuple[int, int]:
    """List, or remove with ``include_train``, the surplus epoch-end files ``entries``
    (``surplus_epoch_ends``) run by run; returns how many and how many bytes went (or would go)."""
    by_run: dict[Path, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_run[entry.path.parent.parent].append(entry)
    count = freed = 0
    for run, group in by_run.items():
        if not include_train:
            for entry in group:
                print(
                    f"kept {entry.path}: epoch-end weights no given config's export.average wants "
                    f"({human(entry.size)}); --include-train removes them"
                )
            continue
        if group[0].lock is not None:
            print(f"kept {run / 'epoch_ends'}: its Train run is in use (a process holds {group[0].lock})")
            continue
        if dry_run:
            for entry in group:
                print(f"would remove {entry.path} ({human(entry.size)})")
        elif not remove_epoch_ends(
            group, lambda e: print(f"removing {e.path} ({human(e.size)})", flush=True)
        ):
            print(f"kept {run / 'epoch_ends'}: its Train run started (its lock is held)")
            continue
        freed += sum(entry.size for entry in group)
        count += len(group)
    return count, freed


def main(argv=None) -> int:
    """List (``--dry-run``) or remove what no given config reaches; exit 2 on a config that cannot be
    resolved (nothing removed)."""
    parser = argparse.ArgumentParser(prog="deepspeech-train gc", description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", required=True, help="a config whose outputs are kept")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    parser.add_argument(
        "--include-train",
        action="store_true",
        help="also remove Train runs no given config reaches, and epoch-end weights kept in a reached run "
        "that no given config's export.average wants",
    )
    args = parser.parse_args(argv)
    symlinks: list[Path] = []
    try:
        configs = [load_config(path) for path in args.config]
        entries = unreachable(configs, symlinks)
        epoch_ends = surplus_epoch_ends(configs)
    except ConfigError as error:
        print(f"error: {error} (gc removed nothing)", file=sys.stderr)
        return 2
    except OSError as error:
        print(
            f"error: gc cannot read {error.filename}: {error.strerror} (gc removed nothing)", file=sys.stderr
        )
        return 2
    for folder in symlinks:
        print(f"kept {folder}: a symlink to {os.path.realpath(folder)}; gc never follows one")
    trained = [e for e in entries if is_train_run(e) and not args.include_train]
    for entry in trained:
        print(f"kept {entry.path}: a Train run ({human(entry.size)}); --include-train removes it")
    groups: dict[tuple[Path, str], list[Entry]] = defaultdict(list)
    for entry in entries:
        if entry in trained:
            continue
        if entry.lock is not None:
            print(f"kept {entry.path}: in use by a running stage (it holds {entry.lock})")
            continue
        groups[_owner(entry.path)].append(entry)
    freed = count = failed = 0
    for group in groups.values():
        if args.dry_run:
            for entry in group:
                print(f"would remove {entry.path} ({human(entry.size)})")
        else:
            try:
                removed = remove_group(
                    group, lambda e: print(f"removing {e.path} ({human(e.size)})", flush=True)
                )
            except OSError as error:
                failed += 1
                _cannot_remove(error)
                continue
            if not removed:
                print(
                    f"kept {', '.join(str(e.path) for e in group)}: a stage started on it (its lock is held)"
                )
                continue
        freed += sum(entry.size for entry in group)
        count += len(group)
    try:
        trimmed, size = _trim_epoch_ends(epoch_ends, args.dry_run, args.include_train)
    except OSError as error:
        failed += 1
        _cannot_remove(error)
        trimmed = size = 0
    count, freed = count + trimmed, freed + size
    verb = "would free" if args.dry_run else "freed"
    print(f"{count} unreachable outputs; {verb} {human(freed)} ({freed} bytes)")
    return 1 if failed else 0


def _cannot_remove(error: OSError) -> None:
    """One line on standard error for an entry gc could not remove (the others are still removed)."""
    print(
        f"error: gc could not remove {error.filename}: {error.strerror} (kept; the rest goes on)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
