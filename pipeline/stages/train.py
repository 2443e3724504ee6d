"""The Train stage: wire config, devices, caches and the trainer; write the resolved config and the report."""

from __future__ import annotations

import contextlib
import time

import tensorflow as tf
import yaml

from pipeline.config_loader import config_to_dict
from pipeline.files import write_text_atomic
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from pipeline.model.labels import model_alphabet
from pipeline.reports import TrainReport, write_report
from pipeline.stages.outputs import split_cache
from pipeline.train.determinism import deterministic_ops
from pipeline.train.distribute import DistributionError, configure_devices, make_strategy, training_role
from pipeline.train.hooks import TrainHooks
from pipeline.train.loop import Trainer
from pipeline.train.tasks import TaskData
from pipeline.workdir import TrainRun

# What a collective operation raises when a peer worker died or stopped answering.
LOST_WORKER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.InternalError,
)


def train_stage(layout: Layout, run: TrainRun | None = None, hooks: TrainHooks | None = None) -> TrainReport:
    """Train on the cached train split, validate on dev; write the resolved config and ``train_report.json``.

    Resumes from the checkpoints in ``run`` (default: the fingerprinted Train run directory). Without
    a dev split (``data.dev_files`` or corpora) it trains without validation (the trainer warns; the last
    checkpoint is the best). A multi-task config trains every task (``pipeline.train.tasks``) on its
    splits and labels. The process takes a cluster role from ``TF_CONFIG`` only with
    ``distribution.strategy: multi_worker``; then only the chief writes the config and the report (the
    report returned by another worker is its own account of the same run, which it does not write).
    """
    config = layout.config
    run = run or layout.train_run
    configure_devices(config.distribution)
    role = training_role(config.distribution)
    strategy = make_strategy(config.distribution)
    if config.tasks:
        tasks = task_data(layout)
    else:
        tasks = [TaskData.only(*_splits(layout), model_alphabet(layout.config, layout.alphabet))]
    if role.is_chief:
        run.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run.resolved_config, yaml.safe_dump(config_to_dict(config), sort_keys=False))
    started = time.time()
    # Two pipelines whose configs share this Train fingerprint take turns on its directory;
    # the second resumes from the first one's checkpoints (and finds the run finished).
    with (
        stage_lock(run.root) if role.is_chief else contextlib.nullcontext(),
        deterministic_ops(config.training.deterministic, bool(tf.config.list_physical_devices("GPU"))),
    ):
        trainer = Trainer(
            config,
            run.root,
            tasks,
            strategy,
            role,
            hooks,
            fingerprint=layout.train_fingerprint,
            started=started,
            init_digest=layout.init_from_digest,
        )
        try:
            report = trainer.fit()
        except LOST_WORKER_ERRORS as error:
            if role.count == 1:
                raise
            raise DistributionError(
                f"worker {role.index} of {role.count}: lost contact with another worker "
                f"({type(error).__name__}: {str(error).splitlines()[0][:300]}). "
                "Every worker stops; restart all of them to resume from the chief's last checkpoint "
                f"in {run.checkpoints}"
            ) from error
    if role.is_chief:
        write_report(run.report, report)
    return report


def _splits(layout: Layout):
    """(the train split's cache index, the dev split's or None without a dev split) of ``layout``."""
    config = layout.config
    train = split_cache(layout, "train")
    dev = split_cache(layout, "dev") if config.has_split("dev") else None
    return train, dev


def task_data(layout: Layout) -> list[TaskData]:
    """Every task of a multi-task config as the trainer reads it: its weight, splits and labels."""
    found = []
    for entry in layout.config.multitask.tasks:
        task = layout.for_task(entry.name)
        train, dev = _splits(task)
        found.append(
            TaskData(entry.name, entry.weight, train, dev, model_alphabet(task.config, task.alphabet))
        )
    return found
