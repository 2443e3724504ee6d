"""Force one stage to run again: remove its outputs and those of every stage that depends on it, \
then run the DAG.

    python -m tasks.rerun Train --config configs/sample.yaml [--local-scheduler] [--audio clip.flac]
    python -m tasks.rerun FeaturesSplit --split dev --config ...
    python -m tasks.rerun Import --corpus librispeech-LibriSpeech --config ...   (Imports: every corpus)
    python -m tasks.rerun Evaluate --task fr --config ...   (a multi-task config; without --task: every task)

(``make rerun STAGE=Train CONFIG=...`` calls this.) Stages before the named one
are left untouched; the DAG's roots (``pipeline.dag``: the stages the config's
pipeline has that no other one reads, Evaluate and Export, and Transcribe when
``--audio`` is given) are then run as usual, so the removed stages are rebuilt.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import luigi

import tasks
from pipeline.config_loader import load_config
from pipeline.dag import instances, pipeline_instances, stages_by_task
from pipeline.files import remove_entry
from pipeline.locks import in_use, lock_path, try_locks
from tasks.base import task_class
from tasks.preflight import PreflightError, check_objective_reach, stage_tasks
from tasks.reenable import dag

log = logging.getLogger("luigi-interface")


def dag_roots(config: str, given: dict) -> list:
    """The tasks no other task of the config's pipeline reads: one for each stage instance the config's
    pipeline has (``instances``: Transcribe with ``--audio``, every task's in a multi-task config) that no
    other one requires."""
    cfg = load_config(config)
    candidates = [
        task_class(name)(config=config, **params)
        for name, params in pipeline_instances(cfg, {**given, "task": ""})
    ]
    required = set()
    for task in candidates:
        required |= set(dag(luigi.task.flatten(task.requires())))
    return [task for task in candidates if task.task_id not in required]


def dependents(targets: set[str], tasks: dict) -> set[str]:
    """Ids of ``targets`` and of every task that (transitively) requires one of them."""
    result = set(targets)
    changed = True
    while changed:
        changed = False
        for task_id, task in tasks.items():
            if task_id not in result and any(
                dep.task_id in result for dep in luigi.task.flatten(task.requires())
            ):
                result.add(task_id)
                changed = True
    return result


def _in_use(paths: list[Path]) -> tuple[Path, Path] | None:
    """(path, lock) of the first stage output a live process holds locked: the output itself (Features'
    cache, Train's and LanguageModel's directory, Evaluate's) or the export directory an export entry
    lies in. The locks are flocks, held across machines on NFS (``pipeline.locks``)."""
    for path in paths:
        for output in (path, path.parent):
            lock = in_use(output)
            if lock is not None:
                return path, lock
    return None


def _locks(paths: list[Path]) -> list[Path]:
    """The lock files a writer of ``paths`` holds: each output's beside it (made for the removal when
    missing: a stage starting now makes the same one) and, when it exists, its folder's (an export
    entry's)."""
    locks = [lock_path(path) for path in paths if path.parent.is_dir()]
    for path in paths:
        locks += [
            lock for lock in (lock_path(path.parent), lock_path(path.parent, inside=True)) if lock.exists()
        ]
    return locks


def main(argv=None) -> int:
    """Remove the stage's outputs and its dependents', then run the roots; exit 0 on success, 30 on failure,
    2 when an output is in use by a running pipeline (nothing is removed then)."""
    parser = argparse.ArgumentParser(prog="python -m tasks.rerun", description=__doc__.splitlines()[0])
    named = stages_by_task()
    parser.add_argument("stage", choices=sorted(named))
    parser.add_argument("--config", required=True)
    parser.add_argument("--split", choices=("train", "dev", "test"), help="for FeaturesSplit")
    parser.add_argument(
        "--corpus", help="for Import: the corpus's key (data.corpora[].name or <importer>-<folder>)"
    )
    parser.add_argument("--audio", help="also run Transcribe on this file (and rerun it)")
    parser.add_argument("--task", default="", help="a multi-task config's task (default: every task)")
    parser.add_argument("--local-scheduler", action="store_true", help="do not use the central scheduler")
    parser.add_argument("--scheduler-host", help="central scheduler host (default: luigi.cfg)")
    parser.add_argument("--scheduler-port", type=int, help="central scheduler port (default: luigi.cfg)")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    args = parser.parse_args(argv)
    stage = named[args.stage]
    for param in stage.params if args.stage == stage.task else ():
        if param != "task" and not getattr(args, param):
            parser.error(f"{args.stage} needs --{param}")
    try:  # a --task that names no instance would remove nothing and run the DAG as it is
        given = {"task": args.task, "split": args.split, "corpus": args.corpus, "audio": args.audio}
        config = load_config(args.config)
        stage_tasks(config, args.stage, given)
        for root in dag_roots(args.config, {"audio": args.audio}):  # what Luigi's --config check does
            check_objective_reach(config, root.get_task_family())
    except PreflightError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    roots = dag_roots(args.config, {"audio": args.audio})
    graph = dag(roots)
    if args.stage == stage.group:  # every instance: Features, Imports
        group = getattr(tasks, stage.group)
        narrowed = {"task": args.task} if args.task and "task" in group.get_param_names() else {}
        targets = luigi.task.flatten(group(config=args.config, **narrowed).requires())
        targets = [t for t in targets if not args.task or getattr(t, "task", "") == args.task]
    else:
        given = {p: getattr(args, p) for p in stage.params}
        found = instances(load_config(args.config), stage, given) if "task" in stage.params else [given]
        targets = [task_class(stage.name)(config=args.config, **params) for params in found]
    doomed = dependents({t.task_id for t in targets}, graph)
    # Stage outputs are computed before anything is removed: Export and Transcribe find theirs by content.
    paths = [(task_id, path) for task_id in sorted(doomed) for path in graph[task_id].stage_paths()]
    busy = _in_use([Path(path) for _, path in paths])
    if busy:
        print(
            f"error: {busy[0]} is in use by a running pipeline (it holds {busy[1]}), maybe on another "
            f"machine; wait for it to finish or stop it, then rerun (nothing was removed)",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        for task_id, path in paths:
            print(f"would remove {path}  ({task_id})")
        return 0
    # The check above is not trusted for the removal: it happens while holding, without waiting, the lock
    # every writer of those outputs takes (a stage starting meanwhile makes the removal stop here).
    locks = _locks([Path(path) for _, path in paths])
    made = [lock for lock in locks if not lock.exists()]
    with try_locks(locks) as taken:
        if not taken:
            print(
                "error: a stage started on these outputs meanwhile (its lock is held); wait for it to "
                "finish, then rerun (nothing was removed)",
                file=sys.stderr,
            )
            return 2
        for task_id, path in paths:
            print(f"removing {path}  ({task_id})", flush=True)
            remove_entry(path)
        for lock in made:  # removed still held: a stage starting now locks the file it makes anew
            lock.unlink(missing_ok=True)
    scheduler = {
        key: value
        for key, value in (("scheduler_host", args.scheduler_host), ("scheduler_port", args.scheduler_port))
        if value is not None
    }
    ok = luigi.build(roots, local_scheduler=args.local_scheduler, **scheduler)
    return 0 if ok else 30


if __name__ == "__main__":
    sys.exit(main())
