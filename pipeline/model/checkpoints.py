"""Checkpoint contents and checks: geometry mismatch messages, warm start, and loading a trained model
from a checkpoint or a Train run directory. Weights are read and written under the names of
``pipeline.model.weights``."""

from __future__ import annotations

import logging
from pathlib import Path

import keras
import tensorflow as tf

from pipeline.config import Config
from pipeline.model import build_model, model_family
from pipeline.model.heads import task_weight_names
from pipeline.model.normalization import NAME, is_normalization_weight, normalization_of
from pipeline.model.weights import named_weights
from pipeline.workdir import TrainRun, init_digest, trained_on_raw_features

log = logging.getLogger(__name__)


class CheckpointMismatchError(RuntimeError):
    """A checkpoint's weights do not fit the model built from the config."""


class InitFromChanged(CheckpointMismatchError):
    """``training.init_from`` is not what the run's fingerprint holds: it changed after the run was
    scheduled (a warm start from a run that is still training)."""


def check_init_from(source: str | Path, scheduled: str) -> None:
    """InitFromChanged, one line naming ``source``, unless what a warm start from it loads still has the
    digest ``scheduled`` (``workdir.init_digest``: the Train fingerprint's)."""
    if init_digest(source) != scheduled:
        raise InitFromChanged(
            f"training.init_from: {source} changed since this run was scheduled (its Train fingerprint holds "
            f"the checkpoint that was there then; a run still training saves new ones): run Train again to "
            f"start from it as it is now, once it no longer changes (a finished run, or a copy of its "
            f"checkpoint)"
        )


# A weight's key in a checkpoint of this project: its name between these.
KEY_PREFIX, KEY_SUFFIX = "weights/", "/.ATTRIBUTES/VARIABLE_VALUE"


def checkpoint_key(name: str) -> str:
    """The key of weight ``name`` (``pipeline.model.weights``) in a checkpoint of this project."""
    # tf.train.Checkpoint escapes "." in object names as "..".
    return KEY_PREFIX + name.replace(".", "..") + KEY_SUFFIX


def resolve_checkpoint(path: str | Path) -> str:
    """A checkpoint prefix from a prefix, a checkpoint directory, or a Train run directory."""
    path = Path(path)
    for directory in (path, TrainRun(path).best, TrainRun(path).checkpoints):
        if directory.is_dir():
            latest = tf.train.latest_checkpoint(str(directory))
            if latest:
                return latest
    if Path(str(path) + ".index").exists():
        return str(path)
    raise CheckpointMismatchError(
        f"{path}: no checkpoint found (expected a checkpoint prefix, a directory with a "
        f"'checkpoint' file, or a Train run directory)"
    )


def shape_differences(prefix: str, model, names: dict[str, str] | None = None) -> list[str]:
    """Descriptions of weights whose shape differs between checkpoint ``prefix`` and ``model``
    (or that are missing); ``names``: each weight's name in the checkpoint when it is not its own."""
    stored = dict(tf.train.list_variables(prefix))
    differences = []
    for name, variable in named_weights(model).items():
        key = checkpoint_key((names or {}).get(name, name))
        if key not in stored:
            differences.append(f"{name}: missing from the checkpoint")
        elif list(stored[key]) != list(variable.shape):
            differences.append(f"{name}: checkpoint {list(stored[key])} vs model {list(variable.shape)}")
    if normalization_of(model) is None and _normalizes(stored):  # its statistics would be left unread
        differences.append("feature_normalization: in the checkpoint, not in the model")
    return differences


def _weights_of(reader) -> dict:
    """Every weight a checkpoint of this project holds, by its name (``checkpoint_key`` read back)."""
    return {
        key[len(KEY_PREFIX) : -len(KEY_SUFFIX)].replace("..", "."): reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key.startswith(KEY_PREFIX) and key.endswith(KEY_SUFFIX)
    }


def _normalizes(stored_keys) -> bool:
    """Whether a checkpoint's variable names hold a feature normalisation layer's weights."""
    return any(NAME in key.split("/")[1].split(".") for key in stored_keys if key.startswith(KEY_PREFIX))


def check_geometry(prefix: str, model, directory: str | Path, names: dict[str, str] | None = None) -> None:
    """Raise CheckpointMismatchError naming ``directory`` and each differing weight (``names``: as in
    ``shape_differences``)."""
    differences = shape_differences(prefix, model, names)
    if differences:
        raise CheckpointMismatchError(
            f"checkpoint in {directory} does not fit the model (changed alphabet, n_hidden or "
            f"features.normalize?): "
            + "; ".join(differences)
            + ". Use another paths.work_dir, or training.init_from with training.drop_source_layers "
            "to start from it."
        )


def _objective_head_name(model) -> str | None:
    """The name of the objective's own layers (``Objective.build_head``), the first part of their weights'
    names: a single-task model's ``objective_head`` layer, or those of a multi-task model's tasks (a
    method of the task), None when there are none."""
    head = getattr(model, "objective_head", None)
    if isinstance(head, keras.layers.Layer):
        return head.name
    if callable(head):
        names = sorted({layer.name for layer in map(head, range(len(model.tasks))) if layer is not None})
        return names[0] if names else None
    return None


def warm_start(
    model, source: str | Path, drop_layers: int, config: Config | None = None, alphabet=None
) -> list[str]:
    """Copy weights from ``source`` into ``model``, except the last ``drop_layers`` layers: a checkpoint of
    this project, or a model the family imports (``ModelFamily.import_weights``, e.g. a DeepSpeech/Coqui
    ``.tflite`` or TF1 checkpoint), checked against ``config`` and ``alphabet`` when given.

    The objective's own layers (a transducer's predictor and joiner) count as the model's last layer;
    a source without them (a CTC run, an imported model) leaves them as they were made.

    Returns the names of the weights copied. Optimizer state is not touched, nor the feature normalisation
    (``features.normalize: global``): it keeps the statistics of the new run's training set, whatever the
    source normalised with (a run of the earlier layout holds none); a model the family imports was
    trained on raw features, so the family folds those statistics into its weights
    (``ModelFamily.fold_normalization``), as it does for a run of this project that normalised nothing
    (``trained_on_raw_features``). A checkpoint that normalises is refused by a model that does not.
    """
    family = model_family(model.model_config.architecture)
    own = normalization_of(model)  # the run's statistics, with features.normalize: global
    try:
        imported = family.import_weights(Path(source), config, alphabet)
    except (ValueError, KeyError) as error:
        raise CheckpointMismatchError(f"training.init_from: {str(error).strip(chr(39))}") from None
    if imported is None:
        reader = tf.train.load_checkpoint(resolve_checkpoint(source))
        if own is None and _normalizes(reader.get_variable_to_shape_map()):
            raise CheckpointMismatchError(
                f"training.init_from: {source} was trained on globally normalised features (its checkpoint "
                f"holds feature_normalization); set features.normalize: global for the run too"
            )

        def stored(name):
            key = checkpoint_key(name)
            return reader.get_tensor(key) if reader.has_tensor(key) else None

        if own is not None and trained_on_raw_features(source):
            imported = _weights_of(reader)
            if any(name.startswith("tasks.") for name in imported):
                raise CheckpointMismatchError(
                    f"training.init_from: {source} has a network per task trained on raw features: its "
                    f"statistics cannot be folded in; set features.normalize: false"
                )
    if imported is not None:
        if own is not None:  # trained on raw features: fold the run's statistics in
            try:
                imported = family.fold_normalization(imported, *own)
            except (ValueError, KeyError) as error:
                raise CheckpointMismatchError(f"training.init_from: {source}: {error}") from None
        stored = imported.get
    layers = family.layers(model)
    # The objective's own layers: the last layer, when the model (or a task of it) has some.
    head_name = _objective_head_name(model)
    if head_name is not None:
        layers = (*layers, head_name)
    if drop_layers > len(layers):
        raise CheckpointMismatchError(
            f"training.drop_source_layers: {drop_layers}, but the "
            f"{model.model_config.architecture} model has {len(layers)} layers"
        )
    dropped = set(layers[len(layers) - drop_layers :]) if drop_layers else set()
    # A multi-task model's weights also read as a single-task model's (its heads as the output layer): a
    # multi-task run starts from a multi-task checkpoint of its names, or from a single-task one.
    plain_of = getattr(model, "single_task_name", lambda name: name)
    copied = []
    for name, variable in named_weights(model).items():
        plain = plain_of(name)
        if plain.split(".")[0] in dropped or is_normalization_weight(plain):
            continue  # the normalisation keeps the new run's own training statistics
        value = stored(name)
        if value is None and plain != name:
            value = stored(plain)
        if value is None and plain.split(".")[0] == head_name:
            continue  # a source trained without this objective's head (a CTC run): the head starts afresh
        if value is None:
            raise CheckpointMismatchError(f"{source}: weight {name} is missing from the checkpoint")
        if list(value.shape) != list(variable.shape):
            raise CheckpointMismatchError(
                f"{source}: weight {name} has shape {list(value.shape)}, "
                f"the model needs {list(variable.shape)}; "
                f"raise training.drop_source_layers to re-initialise that layer"
            )
        variable.assign(value)
        copied.append(name)
    return copied


def load_trained_model(config: Config, checkpoint: str | Path, n_input: int, n_classes: int):
    """Build the model of ``config`` and load the weights of ``checkpoint`` (a prefix, a checkpoint
    directory or a Train run directory, whose best-dev checkpoint is taken). For a task of a multi-task
    config (its view), the task's single-task model: the shared part and its head or network
    (``pipeline.model.heads.task_weight_names``)."""
    prefix = resolve_checkpoint(checkpoint)
    model = build_model(config.model, n_input, n_classes, normalized=config.features.normalize == "global")
    stored = task_weight_names(config, model)
    try:
        check_geometry(prefix, model, checkpoint, stored)
        weights = {stored[name]: variable for name, variable in named_weights(model).items()}
        tf.train.Checkpoint(weights=weights).read(prefix).expect_partial()
    except (tf.errors.OpError, ValueError) as error:
        raise CheckpointMismatchError(
            f"{prefix}: damaged checkpoint ({str(error).splitlines()[0][:200]}); "
            f"make rerun STAGE=Train to train again"
        ) from None
    return model
