"""A transducer's batch plans: the cap on its joint scores (``pipeline.batches.joint_cap``) for a split of
a config, and a plan whose utterance is over it alone refused in one line naming the audio."""

from __future__ import annotations

import numpy as np

from pipeline.batches.buckets import ShapeGrid
from pipeline.batches.joint_cap import FLOAT_BYTES, JointCap, JointTooLarge
from pipeline.config import Config, is_transducer
from pipeline.features.cache import CacheIndex
from pipeline.model import model_family
from pipeline.train.checkpointing import TrainingError


def joint_cap(config: Config, index: CacheIndex, grid: ShapeGrid | None, classes: int) -> JointCap | None:
    """The cap of a split (``index``, a ``CacheIndex``, on ``grid``) for a model of ``classes`` classes:
    None unless ``config`` trains the built-in transducer (its ``model.transducer.max_joint_mib``)."""
    if not is_transducer(config):
        return None
    family = model_family(config.model.architecture)
    return JointCap(
        np.asarray(index.lengths),
        np.array([len(label) for label in index.labels], np.int64),
        lambda frames: family.output_lengths(config.model, frames),
        classes,
        config.model.transducer.max_joint_mib,
        grid,
        config.model.transducer.joint_dim,
        2 if config.training.precision.startswith("mixed") else FLOAT_BYTES,
    )


def planned(index: CacheIndex, plan, *args):
    """``plan(*args)`` (a batch plan of the split ``index``), an utterance whose transducer scores alone
    are over the cap (``JointTooLarge``) refused in one line naming its audio."""
    try:
        return plan(*args)
    except JointTooLarge as error:
        raise TrainingError(
            f"{index.paths[error.index]}: {error}; raise the cap, or leave such utterances out "
            f"(data.max_duration_s)"
        ) from None


def checked_eval_cap(
    config: Config, index: CacheIndex, grid: ShapeGrid | None, classes: int
) -> JointCap | None:
    """``joint_cap`` of a split read in evaluation batches (validation, Evaluate), its plan made once so
    that an utterance over the cap alone is refused (``planned``) before any batch runs."""
    from pipeline.batches.dataset import eval_batches

    joint = joint_cap(config, index, grid, classes)
    if joint is not None:
        training = config.training
        planned(
            index,
            eval_batches,
            index.lengths,
            training.dev_batch_size,
            training.max_batch_frames,
            grid,
            joint,
        )
    return joint
