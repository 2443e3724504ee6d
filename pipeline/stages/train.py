"""The Train stage: wire config, devices, caches and the trainer; write the resolved config and the report."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import yaml

from pipeline.config import Config
from pipeline.config_loader import config_to_dict
from pipeline.dag import Node, Stage, alphabet_of, task_config
from pipeline.files import write_text_atomic
from pipeline.fingerprints import FingerprintInputs
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from pipeline.model.labels import model_alphabet
from pipeline.reports import TrainReport, write_report
from pipeline.stages.outputs import split_cache
from pipeline.train.hooks import TrainHooks
from pipeline.workdir import TRAIN_DIR, TrainRun, trained_on_raw_features

if TYPE_CHECKING:
    from pipeline.train.tasks import TaskData


def _train_upstream(config: Config, params: dict) -> list[Node]:
    """The train features, and the dev features when there is a dev split (without one, no validation), and
    the Alphabet stage when it builds the alphabet: of every task in a multi-task config."""
    nodes: list[Node] = []
    for task in config.tasks or ("",):
        task_params = {"task": task} if task else {}
        view = task_config(config, task_params)
        splits = [split for split in ("train", "dev") if split == "train" or view.has_split(split)]
        nodes += [("features", {"split": split, **task_params}) for split in splits]
        nodes += [node for node in alphabet_of(config, task_params) if node not in nodes]
    return nodes


def _normalization(inputs: FingerprintInputs, params: dict) -> dict:
    """With ``features.normalize: global`` the statistics are weights of the model
    (``pipeline.model.normalization``): its checkpoints and exports hold them, as those of runs that
    normalised outside the model did not; a warm start from a run trained on raw features folds them
    into its first weights (``pipeline.model.checkpoints.warm_start``)."""
    config = inputs.config
    if config.features.normalize != "global":
        return {}
    init_from = config.training.init_from
    folded = {"init_from": "raw features, folded"} if init_from and trained_on_raw_features(init_from) else {}
    return {"normalization": "in_model", **folded}


STAGE = Stage(
    "train",
    "Train",
    upstream=_train_upstream,
    derived=_normalization,
    directory=TRAIN_DIR,
    outputs=lambda layout, params: [layout.train_run.root],
)


def _lost_worker_errors() -> tuple[type, ...]:
    """What a collective operation raises when a peer worker died or stopped answering."""
    import tensorflow as tf

    return (
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
    # TensorFlow is loaded here, not when the DAG reads this module's declaration.
    import tensorflow as tf

    from pipeline.train.determinism import deterministic_ops
    from pipeline.train.distribute import DistributionError, configure_devices, make_strategy, training_role
    from pipeline.train.loop import Trainer
    from pipeline.train.tasks import TaskData

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
        except _lost_worker_errors() as error:
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
    from pipeline.train.tasks import TaskData

    found = []
    for entry in layout.config.multitask.tasks:
        task = layout.for_task(entry.name)
        train, dev = _splits(task)
        found.append(
            TaskData(entry.name, entry.weight, train, dev, model_alphabet(task.config, task.alphabet))
        )
    return found
