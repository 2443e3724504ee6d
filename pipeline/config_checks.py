"""The schema's cross-checks: what involves more than one key, or the code a key names (a model family,
a decoder, the Coqui export's features). The loader runs them on every config it makes
(``pipeline.config_loader``); the schema (``pipeline.config``) only says what a config is."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from native_client.plugins import PluginError, builtin_names, plugin_exists
from pipeline.config import Config, ConfigError, is_transducer, objective_name
from pipeline.export.coqui_tflite import check_exportable
from pipeline.features.frontend import feature_pipeline
from pipeline.model import model_family
from pipeline.model.objective import CTC_OUTPUT, TRANSDUCER_OUTPUT
from pipeline.model.objectives import model_objective
from pipeline.workdir import export_root, task_export_root


def validate_config(config: Config) -> None:
    """Checks that involve more than one key; raises ConfigError naming the file and the key."""
    src = config.source
    augment = config.augment
    if any(not 0.5 <= f <= 2.0 for f in augment.speed_factors):
        raise ConfigError(
            f"{src}: augment.speed_factors: expected factors between 0.5 and 2.0, "
            f"got {list(augment.speed_factors)}"
        )
    if len(augment.noise_snr_db) != 2 or augment.noise_snr_db[0] > augment.noise_snr_db[1]:
        raise ConfigError(
            f"{src}: augment.noise_snr_db: expected [low, high] with low <= high, "
            f"got {list(augment.noise_snr_db)}"
        )
    if (augment.gain_db or augment.noise_dir) and not augment.copies:
        raise ConfigError(
            f"{src}: augment.gain_db / augment.noise_dir act on copies: "
            "set augment.speed_factors or augment.audio_copies"
        )
    named_plugin(
        model_family, "pipeline.model", config.model.architecture, "model.architecture", "model family", src
    )
    _check_objective(config, src)

    if config.export.coqui_tflite:
        if config.model.output != "characters":
            raise ConfigError(
                f"{src}: export.coqui_tflite: their layout serialises a character alphabet; "
                f"model.output {config.model.output!r} cannot be written in it"
            )
        try:
            check_exportable(feature_pipeline(config.features), config.model.architecture)
        except ValueError as error:
            raise ConfigError(f"{src}: export.coqui_tflite: {error}") from None
    average = config.export.average
    if average.last and average.best:
        raise ConfigError(
            f"{src}: export.average: give last or best, not both (last {average.last}, best {average.best})"
        )
    # A multi-task run validates when one of its tasks has a dev split (validate_tasks checks that).
    if average.best and not config.tasks and not _validates(config, (config,)):
        raise ConfigError(
            f"{src}: export.average.best ranks checkpoints by their validation, and this config has none "
            f"(no dev split, or training.validation_epochs 0); use export.average.last"
        )
    unknown = sorted(set(config.data.clean.splits) - {"train", "dev", "test"})
    if len(set(config.data.clean.splits)) < len(config.data.clean.splits):
        raise ConfigError(
            f"{src}: data.clean.splits: a split is named twice: {list(config.data.clean.splits)}"
        )
    if unknown:
        raise ConfigError(
            f"{src}: data.clean.splits: unknown split(s) {', '.join(unknown)}; expected train, dev, test"
        )
    if config.training.epochs == 0:
        raise ConfigError(f"{src}: training.epochs: expected a non-zero integer, got 0")
    _check_schedule(config.training, src)
    _check_buckets(config.training, src)
    decoder = config.decoder
    if not plugin_exists("native_client.decoders", decoder.type):
        raise ConfigError(
            f"{src}: decoder.type: no decoder {decoder.type!r} (a module of native_client/decoders/ such as "
            f"beam or greedy, or the dotted name of your own)"
        )
    if not re.fullmatch(r"\d+(\.\d+)?[%bBkKmMgGtT]?", decoder.lm_memory):
        raise ConfigError(
            f"{src}: decoder.lm_memory: expected a size such as 2G, 500M or 50%, got {decoder.lm_memory!r}"
        )
    if decoder.lm_prune and (
        len(decoder.lm_prune) > decoder.lm_order
        or min(decoder.lm_prune) < 0
        or list(decoder.lm_prune) != sorted(decoder.lm_prune)
    ):
        raise ConfigError(
            f"{src}: decoder.lm_prune: expected at most decoder.lm_order ({decoder.lm_order}) "
            f"non-decreasing thresholds, got {list(decoder.lm_prune)}"
        )
    if (decoder.lm_prune or decoder.lm_top_k) and decoder.lm_builder == "python":
        raise ConfigError(
            f"{src}: decoder.lm_prune / decoder.lm_top_k need decoder.lm_builder kenlm or auto "
            f"(the Python estimator neither prunes nor filters)"
        )


def _check_schedule(training, src: str) -> None:
    """ConfigError for a learning-rate schedule its other keys do not fit."""
    if training.lr_decay == "noam" and not training.warmup_steps:
        raise ConfigError(
            f"{src}: training.lr_decay: noam peaks at learning_rate after training.warmup_steps updates: "
            f"set warmup_steps (ESPnet and WeNet use 25000; a few hundred on a small corpus)"
        )
    if training.lr_decay == "cosine" and training.min_learning_rate >= training.learning_rate:
        raise ConfigError(
            f"{src}: training.min_learning_rate: the cosine schedule falls from learning_rate "
            f"({training.learning_rate:g}) to it, so it must be lower, got {training.min_learning_rate:g}"
        )


def _check_buckets(training, src: str) -> None:
    """ConfigError for a shape grid that does not grow or pads more than it saves."""
    if training.bucket_growth and not 1.0 < training.bucket_growth <= 2.0:
        raise ConfigError(
            f"{src}: training.bucket_growth: the grid's growth a step, above 1 and at most 2 (1.1 pads "
            f"at most 10%), or 0 for no grid; got {training.bucket_growth:g}"
        )


def _validates(config: Config, views) -> bool:
    """Whether Train validates ``config``'s run: ``training.validation_epochs`` and a dev split in one of
    ``views`` (the config itself, or a multi-task config's tasks)."""
    return config.training.validation_epochs > 0 and any(view.has_split("dev") for view in views)


# A task's name: its --task, its head's weight names, its export folder.
TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# The data keys a phonemes task takes from its ``of`` task instead.
PHONEME_TASK_TAKES = ("train_files", "dev_files", "test_files", "corpora", "text")


def task_source(config: Config, name: str) -> str:
    """What an error about task ``name`` of ``config`` starts with: the file and the task's entry."""
    index = config.multitask.names.index(name)
    return f"{config.source}: multitask.tasks[{index}] ({name})"


def validate_tasks(config: Config) -> None:
    """The checks of ``multitask``: task names, a phonemes task's ``of``, one alphabet with ``sharing:
    shared``, a family with heads for ``sharing: heads``, and every task's view (``Config.task_view``)
    through ``validate_config``; raises ConfigError naming the file, the task's entry and the key."""
    src, multitask = config.source, config.multitask
    if not multitask.tasks:
        if (multitask.sharing, multitask.sampling) != ("heads", "proportional"):
            raise ConfigError(
                f"{src}: multitask.tasks: no task given (multitask.sharing and sampling need tasks)"
            )
        return
    seen: dict[str, int] = {}
    for index, task in enumerate(multitask.tasks):
        where = f"{src}: multitask.tasks[{index}]"
        # Digits only would read as one of a versioned export_dir's numbered versions.
        if not TASK_NAME.fullmatch(task.name) or task.name.isdigit():
            raise ConfigError(
                f"{where}.name: {task.name!r} is not a task name (letters, digits, '.', '_' and '-', "
                f"starting with a letter or digit, not digits only)"
            )
        if task.name in seen:
            raise ConfigError(
                f"{where}.name: {task.name!r} is also multitask.tasks[{seen[task.name]}]'s name"
            )
        seen[task.name] = index
    for index, task in enumerate(multitask.tasks):
        where = f"{src}: multitask.tasks[{index}] ({task.name})"
        if task.targets != "phonemes":
            if task.of is not None:
                raise ConfigError(
                    f"{where}.of: only a task with targets: phonemes reads another task's audio"
                )
            continue
        if not task.of:
            raise ConfigError(
                f"{where}.of: targets: phonemes needs the task whose audio it reads (of: <task>)"
            )
        if task.of not in seen or task.of == task.name:
            raise ConfigError(
                f"{where}.of: {task.of!r} is not another task; the tasks: {', '.join(multitask.names)}"
            )
        if multitask.task(task.of).targets == "phonemes":
            raise ConfigError(
                f"{where}.of: task {task.of!r} is itself a phonemes task; name one with transcripts"
            )
        taken = [key for key in PHONEME_TASK_TAKES if task.data.given(key)]
        if taken:
            raise ConfigError(
                f"{where}.data.{taken[0]}: a phonemes task reads the audio and transcripts of task "
                f"{task.of!r}; give them there"
            )
    views = [config.task_view(name, source=task_source(config, name)) for name in multitask.names]
    for view in views:
        if view.phonemes_of and view.model.output != "characters":
            raise ConfigError(f"{view.source}: model.output: a phonemes task's labels are IPA characters")
        validate_config(view)
        if view.decoder.tune and not view.has_split("dev"):
            raise ConfigError(
                f"{view.source}: decoder.tune: TuneDecoder searches on the task's dev split and it gives "
                f"none (data.dev_files, or data.corpora with one)"
            )
    if config.export.average.best and not _validates(config, views):
        raise ConfigError(
            f"{src}: export.average.best ranks checkpoints by their validation, and this config has none "
            f"(no task has a dev split, or training.validation_epochs 0); use export.average.last"
        )
    _check_export_dirs(config)
    if multitask.sharing == "shared":
        objectives = {view.task: _objective_text(view) for view in views}
        if len(set(objectives.values())) > 1:
            first, other = _first_difference(objectives)
            raise ConfigError(
                f"{src}: multitask.sharing: shared trains one output layer for one objective, but task "
                f"{first} has {objectives[first]} and task {other} {objectives[other]}: give every task the "
                f"same model.objective and model.transducer, or use sharing: heads"
            )
        labels = {
            view.task: (view.model.output, view.paths.alphabet if view.model.output == "characters" else None)
            for view in views
        }
        if len(set(labels.values())) > 1:
            first, other = _first_difference(labels)
            raise ConfigError(
                f"{src}: multitask.sharing: shared has one output layer and so one set of labels, but task "
                f"{first} has {_labels_text(labels[first])} and task {other} {_labels_text(labels[other])}: "
                f"give every task the same model.output and paths.alphabet (auto builds one alphabet from "
                f"all their transcripts), or use sharing: heads"
            )
    if multitask.sharing == "heads" and not model_family(config.model.architecture).has_heads:
        raise ConfigError(
            f"{src}: multitask.sharing: heads needs the {config.model.architecture} family's encoder and "
            f"output layer apart (ModelFamily.encode); use sharing: shared or separate"
        )


def _check_export_dirs(config: Config) -> None:
    """ConfigError when two exported tasks would write one export directory (their ``paths.export_dir``,
    default ``<paths.export_dir>/<task>``): each export would replace the other's, and each Export would
    find its own gone and run again."""
    root, exported = export_root(config.paths), {}
    for task in config.multitask.tasks:
        if not task.export:
            continue
        if task.paths.given("export_dir"):  # as Layout.export_root reads it
            where = Path(os.path.abspath(export_root(task.paths.apply(config.paths))))
        else:
            where = Path(os.path.abspath(task_export_root(root, task.name)))
        if where in exported:
            raise ConfigError(
                f"{task_source(config, task.name)}.paths.export_dir: {where} is also the export directory of "
                f"task {exported[where]}; give each exported task its own"
            )
        exported[where] = task.name


def _first_difference(values: dict) -> tuple[str, str]:
    """(the first task, the first task whose value differs from its) of {task: value}, which differ."""
    first = next(iter(values))
    return first, next(task for task, value in values.items() if value != values[first])


def _objective_text(view: Config) -> str:
    """A task's objective as a refusal names it: its name, and its transducer keys for a transducer."""
    model = view.model
    if is_transducer(view):
        return f"model.objective transducer with model.transducer {dataclasses.asdict(model.transducer)}"
    return f"model.objective {objective_name(model.objective)}"


def _labels_text(labels: tuple) -> str:
    output, alphabet = labels
    return "bytes" if output == "bytes" else f"the alphabet {alphabet or 'data/alphabet.txt (default)'}"


def named_plugin(find, package: str, name: str, key: str, kind: str, src: str):
    """``find(name)``: the implementation ``key`` names, a module of ``package`` (its built-in ones listed as
    examples) or a dotted module of one's own; ConfigError naming ``key`` when there is no such module, or
    it does not define the implementation."""
    if not plugin_exists(package, name):
        examples = " or ".join(builtin_names(package, PLUGIN_ATTRIBUTES[package]))
        folder = package.replace(".", "/")
        raise ConfigError(
            f"{src}: {key}: no {kind} {name!r} (a module of {folder}/ such as {examples}, or the dotted name "
            f"of your own)"
        )
    try:
        return find(name)
    except (PluginError, TypeError) as error:
        raise ConfigError(f"{src}: {error}") from None


# The attribute a module of each plug-in package defines.
PLUGIN_ATTRIBUTES = {"pipeline.model": "FAMILY", "pipeline.model.objectives": "OBJECTIVE"}


def _check_objective(config, src: str) -> None:
    """``model.objective`` names an objective whose output the decoders, the export and the client read,
    or the transducer (its export is the SavedModel and TFLite, which hold its predictor and joiner)."""
    name = config.model.objective
    objective = named_plugin(
        model_objective, "pipeline.model.objectives", name, "model.objective", "objective", src
    )
    if objective.emits == TRANSDUCER_OUTPUT and objective.name == "transducer":
        transducer = config.model.transducer
        if transducer.predictor_dim % transducer.predictor_groups:
            raise ConfigError(
                f"{src}: model.transducer.predictor_groups: {transducer.predictor_groups} does not divide "
                f"predictor_dim {transducer.predictor_dim}"
            )
        # what is exported: a single-task config's model, or a task's (its view; the tasks are checked
        # each, so the pipeline's own objective exports nothing of a multi-task config)
        exported = config.multitask.task(config.task).export if config.task else not config.tasks
        for key, on in (("onnx", config.export.onnx), ("coqui_tflite", config.export.coqui_tflite)):
            if on and exported:
                also = ", or export: false for this task" if config.task else ""
                raise ConfigError(
                    f"{src}: export.{key}: that file holds a CTC model's streaming step; a transducer's "
                    f"predictor and joiner are in the SavedModel and TFLite only (set export.{key}: "
                    f"false{also})"
                )
        return
    if objective.emits != CTC_OUTPUT:
        raise ConfigError(
            f"{src}: model.objective: {name!r} emits {objective.emits!r}; the decoders, the export and the "
            f"client read {CTC_OUTPUT!r} output only"
        )
