"""One model for the tasks of a multi-task config (``multitask.sharing``), built from the family contract.

- ``shared`` (nabu's single one-to-one): one network of the family, one output layer over the one
  alphabet every task has; only the loss (each task's labels) differs per task.
- ``heads`` (single one-to-many): one network whose output layer is the first task's head; every other
  task has a head of its own, made from the family's output layer (``ModelFamily.output_layer``) as wide
  as its objective asks, over the family's encoder (``ModelFamily.encode``).
- ``separate`` (multiple one-to-one): one network of the family per task, built with the same settings.

Each task is trained for its own objective (a task's ``model.objective``: a transducer head beside CTC
heads); an objective with layers of its own (``Objective.build_head``: a transducer's predictor and
joiner) has them per task, after the task's head (``shared``: one objective for every task).

The checkpoint names every weight as a single-task model of the family does, with the heads and networks
told apart: ``heads.<task>.kernel`` for a head, ``heads.<task>.transducer.<name>`` for its objective's
layers, ``tasks.<task>.<name>`` for a separate task's network.
``task_weight_names`` maps a single-task model of one task (what Evaluate and Export build) onto those
names, so that model is read straight from a multi-task checkpoint. ``OneTask`` shows a single-task
model the way the trainer sees a multi-task one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import keras
import tensorflow as tf

from native_client.cmvn import GlobalStats
from pipeline.config import Config, ModelConfig
from pipeline.features.cmvn import train_statistics
from pipeline.model import build_model, model_family
from pipeline.model.normalization import normalized as normalized_features
from pipeline.model.objectives import model_objective
from pipeline.model.weights import named_weights, rng_states, weight_name

SHARINGS = ("shared", "heads", "separate")


def _layer_weights(layer) -> dict:
    """{name: variable} of ``layer``'s weights named from the layer down (``transducer.output.kernel``),
    wherever it was built (in a model's name scope or on its own)."""
    found = {}
    for variable in layer.weights:
        parts = variable.path.split("/")
        found[".".join(parts[parts.index(layer.name) :])] = variable
    return found


def _head_like(layer, units: int, name: str):
    """A new output layer made from ``layer``'s configuration (a Keras ``Dense``) with ``units`` classes."""
    config = layer.get_config()
    if "units" not in config:
        raise TypeError(f"the output layer {layer.name!r} is not a Dense layer: it has no units to set")
    return type(layer).from_config({**config, "units": units, "name": name})


class MultiTaskModel(keras.Model):
    """The model of ``tasks`` (names, in ``multitask.tasks`` order) with ``n_classes`` labels each, shared
    as ``sharing`` says; ``task_models``: each task's ``ModelConfig`` (its objective; default ``config``
    for every task). ``forward(index, ...)`` is the task's forward pass; ``task_variables(indices)`` what
    a step over those tasks trains."""

    def __init__(
        self,
        config: ModelConfig,
        sharing: str,
        tasks: tuple[str, ...],
        n_input: int,
        n_classes: tuple[int, ...],
        precision: str = "float32",
        normalized: bool = False,
        stats=None,
        task_models: tuple[ModelConfig, ...] | None = None,
        **kwargs,
    ):
        super().__init__(dtype=precision, **kwargs)
        if sharing not in SHARINGS:
            raise ValueError(f"multitask.sharing: {sharing!r} is not one of {', '.join(SHARINGS)}")
        if sharing == "shared" and len(set(n_classes)) > 1:
            raise ValueError(
                f"multitask.sharing: shared needs one set of labels, got {list(n_classes)} classes"
            )
        self.model_config, self.sharing, self.tasks = config, sharing, tuple(tasks)
        self.n_input, self.n_classes = n_input, tuple(n_classes)
        self.family = model_family(config.architecture)
        self.task_models = tuple(task_models or (config,) * len(self.tasks))
        self.objectives = tuple(model_objective(model.objective) for model in self.task_models)
        if sharing == "shared" and len({objective.name for objective in self.objectives}) > 1:
            raise ValueError("multitask.sharing: shared needs one objective for every task")
        count = len(n_classes) if sharing == "separate" else 1
        self.networks = [
            build_model(self.task_models[i], n_input, n_classes[i], precision, normalized, stats)
            for i in range(count)
        ]
        self.extra_heads, self.extra_objective_heads = [], []
        if sharing == "heads":
            first = self.family.output_layer(self.networks[0])
            width = int(first.kernel.shape[0])
            for index, units in enumerate(n_classes[1:], 1):
                objective, model = self.objectives[index], self.task_models[index]
                head = _head_like(first, objective.output_width(model, units), f"head_{self.tasks[index]}")
                head.build((None, None, width))
                self.extra_heads.append(head)
                self.extra_objective_heads.append(objective.build_head(model, units, precision))

    def task_objective(self, index: int):
        """The objective task ``index`` is trained for (``pipeline.model.objective``)."""
        return self.objectives[index]

    def head(self, index: int):
        """Task ``index``'s output layer (``heads``): the network's own for the first task."""
        if index == 0:
            return self.family.output_layer(self.networks[0])
        return self.extra_heads[index - 1]

    def network(self, index: int):
        """The network task ``index`` runs through (its own with ``separate``)."""
        return self.networks[index if self.sharing == "separate" else 0]

    def forward(self, index: int, features, lengths, training: bool):
        """``(logits [batch, time', classes] float32, output lengths)`` of task ``index``."""
        network = self.network(index)
        features = normalized_features(network, features)
        if self.sharing != "heads":
            return self.family.forward(network, features, lengths, training)
        hidden, output_lengths = self.family.encode(network, features, lengths, training)
        return tf.cast(self.head(index)(hidden), tf.float32), output_lengths

    def call(self, features, training=False):
        """The first task's logits (what a Keras call of the model gives)."""
        lengths = tf.fill([tf.shape(features)[0]], tf.shape(features)[1])
        return self.forward(0, features, lengths, training)[0]

    def objective_head(self, index: int):
        """The objective's own layers (``Objective.build_head``) task ``index`` is trained with, or None."""
        if self.sharing == "heads" and index > 0:
            return self.extra_objective_heads[index - 1]
        return getattr(self.network(index), "objective_head", None)

    def _task_layers(self, index: int) -> list:
        """Task ``index``'s own layers with ``heads``: its head and its objective's layers, if any."""
        return [layer for layer in (self.head(index), self.objective_head(index)) if layer is not None]

    def task_variables(self, indices) -> list:
        """The trainable variables a step over the tasks ``indices`` changes: the shared part and those
        tasks' heads (``heads``), their networks (``separate``), the whole network (``shared``)."""
        indices = sorted(set(indices))
        if self.sharing == "shared":
            return list(self.networks[0].trainable_variables)
        if self.sharing == "separate":
            return [v for i in indices for v in self.networks[i].trainable_variables]
        first = {id(v) for layer in self._task_layers(0) for v in layer.trainable_variables}
        encoder = [v for v in self.networks[0].trainable_variables if id(v) not in first]
        own = [v for i in indices for layer in self._task_layers(i) for v in layer.trainable_variables]
        return encoder + own

    def named_weights(self) -> dict:
        """{checkpoint name: variable} (see the module docstring)."""
        if self.sharing == "shared":
            return named_weights(self.networks[0])
        if self.sharing == "separate":
            return {
                f"tasks.{task}.{name}": variable
                for task, network in zip(self.tasks, self.networks, strict=True)
                for name, variable in named_weights(network).items()
            }
        first = {id(v) for layer in self._task_layers(0) for v in layer.weights}
        found = {name: v for name, v in named_weights(self.networks[0]).items() if id(v) not in first}
        for index, task in enumerate(self.tasks):
            own = {f"heads.{task}.{v.name}": v for v in self.head(index).weights}
            objective_head = self.objective_head(index)
            if objective_head is not None:
                own.update({f"heads.{task}.{name}": v for name, v in _layer_weights(objective_head).items()})
            clash = sorted(set(own) & set(found))
            if clash:  # a task's name with dots can spell another's weight (fr and fr.transducer.output)
                raise ValueError(
                    f"multitask.tasks: task {task!r}'s weight {clash[0]} is also another task's; rename it"
                )
            found.update(own)
        return found

    def single_task_name(self, name: str) -> str:
        """A checkpoint name of this model as a single-task model of the family names the weight: a head's
        as the output layer's (``heads.fr.kernel``: ``layer_6.kernel``), a separate task's without its
        prefix (``training.init_from`` of a single-task run)."""
        return self._single_task_names.get(name, name)

    @functools.cached_property
    def _single_task_names(self) -> dict[str, str]:
        # From the variables, not by splitting the name: a task's name may hold dots (fr.ca).
        if self.sharing == "heads":
            output = self.family.layers(self.networks[0])[-1]
            names = {
                f"heads.{task}.{v.name}": f"{output}.{v.name}"
                for index, task in enumerate(self.tasks)
                for v in self.head(index).weights
            }
            for index, task in enumerate(self.tasks):
                objective_head = self.objective_head(index)
                if objective_head is not None:
                    names.update({f"heads.{task}.{name}": name for name in _layer_weights(objective_head)})
            return names
        if self.sharing == "separate":
            return {
                f"tasks.{task}.{name}": name
                for task, network in zip(self.tasks, self.networks, strict=True)
                for name in named_weights(network)
            }
        return {}

    def rng_states(self) -> dict:
        """{checkpoint name: variable} of the dropout random-number state (``weights.rng_states``), with
        ``heads`` the other tasks' objective layers' too."""
        if self.sharing == "shared":
            return rng_states(self.networks[0])
        if self.sharing == "heads":
            found = rng_states(self.networks[0])
            for task, head in zip(self.tasks[1:], self.extra_objective_heads, strict=True):
                if head is not None:
                    found.update({f"heads.{task}.{name}": v for name, v in rng_states(head).items()})
            return found
        return {
            f"tasks.{task}.{index}": variable
            for task, network in zip(self.tasks, self.networks, strict=True)
            for index, variable in enumerate(rng_states(network).values())
        }


class OneTask:
    """A single-task model as the step sees a multi-task one (``MultiTaskModel``): task 0 is the model."""

    def __init__(self, model: keras.Model):
        self.model = model
        self.family = model_family(model.model_config.architecture)
        self.objective = model_objective(model.model_config.objective)

    def task_objective(self, index: int):
        """The model's objective."""
        return self.objective

    @property
    def trainable_variables(self) -> list:
        """The model's trainable variables."""
        return self.model.trainable_variables

    def objective_head(self, index: int):
        """The objective's own layers (``Objective.build_head``), or None."""
        return getattr(self.model, "objective_head", None)

    def forward(self, index: int, features, lengths, training: bool):
        """The family's forward pass: (logits, output lengths)."""
        return self.family.forward(
            self.model, normalized_features(self.model, features), lengths, training=training
        )

    def task_variables(self, indices) -> list:
        """Every trainable variable: the one task uses them all."""
        return self.model.trainable_variables


def task_weight_names(config, model) -> dict[str, str]:
    """{name in ``model``: name in the checkpoint} for ``model``, a single-task model of the family built
    for task ``config.task`` of a multi-task ``config`` (a task's view), read from the multi-task run's
    checkpoint; the identity for a single-task config and with ``sharing: shared``."""
    names = {name: name for name in named_weights(model)}
    if not config.task or config.multitask.sharing == "shared":
        return names
    if config.multitask.sharing == "separate":
        return {name: f"tasks.{config.task}.{name}" for name in names}
    head = {
        weight_name(v): v.name for v in model_family(config.model.architecture).output_layer(model).weights
    }
    objective_head = getattr(model, "objective_head", None)
    own = set(_layer_weights(objective_head)) if objective_head is not None else set()
    return {
        name: f"heads.{config.task}.{head[name]}"
        if name in head
        else f"heads.{config.task}.{name}"
        if name in own
        else name
        for name in names
    }


def input_statistics(config: Config, tasks: Sequence) -> GlobalStats | None:
    """The statistics of ``features.normalize: global`` (None without it): of every task's train cache,
    pooled (one encoder, one input distribution)."""
    if config.features.normalize != "global":
        return None
    return train_statistics([task.train.path for task in tasks])


def task_model(config: Config, tasks: Sequence) -> tuple[keras.Model, object]:
    """(the Keras model of ``tasks`` (the run's ``pipeline.train.tasks.TaskData``: names, train caches,
    labels), built in the caller's strategy scope; its view for the step and the
    dev forward passes: ``forward(index, ...)``, ``task_variables``, ``family``, ``task_objective(index)``,
    ``objective_head(index)``). With
    ``features.normalize: global`` its normalisation layer is made holding ``input_statistics`` (in a
    multi-worker run the chief's, as every variable's first value); a restored checkpoint overwrites them
    with its own."""
    precision, n_input = config.training.precision, tasks[0].train.n_input
    normalized = config.features.normalize == "global"
    stats = input_statistics(config, tasks)
    if not config.tasks:
        model = build_model(config.model, n_input, tasks[0].alphabet.n_classes, precision, normalized, stats)
        return model, OneTask(model)
    names, classes = tuple(t.name for t in tasks), tuple(t.alphabet.n_classes for t in tasks)
    task_models = tuple(config.task_view(name).model for name in names)
    model = MultiTaskModel(
        config.model,
        config.multitask.sharing,
        names,
        n_input,
        classes,
        precision,
        normalized,
        stats,
        task_models=task_models,
    )
    return model, model
