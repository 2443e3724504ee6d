"""Re-enable the tasks luigid disabled, before running their DAG again.

After a config or data error a task is disabled at once (``tasks.retries``), and
luigid then ignores every worker's PENDING for it for ``disable_persist`` seconds
(a day), also after a restart (``make scheduler`` keeps its state file): the
fixed command would do nothing. ``deepspeech-train`` runs a command because its
user wants it run, so before scheduling on a central scheduler it re-enables the
disabled tasks of the DAG it is about to run, through luigid's own RPC
(``re_enable_task``, what the UI's "re-enable" button calls). ``luigi --module
tasks`` does not: there, re-enable from the UI or run with ``--local-scheduler``.
"""

from __future__ import annotations

import luigi
from luigi.cmdline_parser import CmdlineParser
from luigi.rpc import RemoteScheduler


def dag(roots) -> dict:
    """Every task reachable from ``roots``: {task_id: task}."""
    seen, todo = {}, list(roots)
    while todo:
        task = todo.pop()
        if task.task_id in seen:
            continue
        seen[task.task_id] = task
        todo.extend(luigi.task.flatten(task.requires()))
    return seen


def re_enable_disabled(luigi_args: list[str], host: str, port: int) -> list[str]:
    """Re-enable, on the scheduler at ``host:port``, every disabled task of the DAG the Luigi command line
    ``luigi_args`` (``--module tasks <Task> ...``) runs; returns their ids (none: nothing was disabled)."""
    with CmdlineParser.global_instance(luigi_args) as parser:
        tasks = dag([parser.get_task_obj()])
    scheduler = RemoteScheduler(f"http://{host}:{port}/")
    try:
        return [task_id for task_id in sorted(tasks) if scheduler.re_enable_task(task_id=task_id)]
    finally:
        scheduler.close()
