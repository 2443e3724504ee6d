"""Checks before any task runs: the config loads, every input file it names exists, a scheduler answers.

Each failure is one line naming the file or key and what to do, so that a run
never starts (and leaves nothing behind) when it could not finish.
"""

from __future__ import annotations

import socket
from pathlib import Path

from pipeline.config import Config
from pipeline.config_checks import task_source
from pipeline.dag import STAGES, instances
from pipeline.data.phonemes import PhonemizerError, check_voice, phoneme_voice
from pipeline.layout import Layout
from pipeline.lm.kenlm_tools import TOOLS_MISSING, find_tools
from pipeline.train.cluster import check_shared_work_dir


class PreflightError(RuntimeError):
    """The run cannot start; the message says why and how to fix it."""


def _is_placeholder(path: str) -> bool:
    # configs/en.yaml's manifests are written as <your train manifest>.csv
    return "<" in path and ">" in path


def input_paths(config: Config) -> list[tuple[str, str]]:
    """(config key, path) of every input file the config names."""
    paths = [
        (f"data.{split}_files", p) for split in ("train", "dev", "test") for p in config.split_files(split)
    ]
    paths += [(f"data.corpora[{i}].path", corpus.path) for i, corpus in enumerate(config.data.corpora)]
    if config.model.output == "characters" and not config.alphabet_auto:  # else the file is not read
        paths.append(("paths.alphabet", str(Layout(config).alphabet)))
    paths += [("decoder.lm_corpus_files", p) for p in config.decoder.lm_corpus_files]
    if config.decoder.lm_path:
        paths.append(("decoder.lm_path", config.decoder.lm_path))
    if config.training.init_from:
        paths.append(("training.init_from", config.training.init_from))
    if config.augment.noise_dir:
        paths.append(("augment.noise_dir", config.augment.noise_dir))
    return paths


def check_inputs(config: Config) -> None:
    """Raise PreflightError for the first missing input (a template's placeholder gets its own message); in
    a multi-task config, of every task (the errors name its entry)."""
    for name in config.tasks:
        view = config.task_view(name, source=task_source(config, name))
        _check_inputs(view, Layout(config).for_task(name))
        if view.phonemes_of:
            try:
                check_voice(phoneme_voice(config.task_view(view.phonemes_of).data.text.language))
            except PhonemizerError as error:
                raise PreflightError(f"{view.source}: {error}") from None
    if not config.tasks:
        _check_inputs(config, Layout(config))
    check_shared_work_dir(config)  # a cluster's workers need one work directory (ConfigError)


# The data keys that say which audio a task trains and is tested on.
SPLIT_KEYS = ("train_files", "dev_files", "test_files", "corpora")


def inherited_splits(config: Config) -> list[str]:
    """Notes for the tasks of a multi-task config that give some of their data's files and take the rest
    from the top-level ``data:`` section (a task's keys override the top level's, one by one: a task that
    gives only ``train_files`` is validated and tested on the top level's files, perhaps another
    language's)."""
    notes = []
    for task in config.multitask.tasks:
        given = [key for key in SPLIT_KEYS if task.data.given(key)]
        if not given or task.targets == "phonemes":
            continue
        taken = [key for key in SPLIT_KEYS if key not in given and getattr(config.data, key)]
        if taken:
            keys = ", ".join(f"data.{key}" for key in taken)
            notes.append(
                f"{task_source(config, task.name)}: gives data.{given[0]} but takes {keys} from the "
                f"top-level data section; give them in the task (an empty list for none) if they are not "
                f"its own"
            )
    return notes


def stage_tasks(config: Config, name: str, given: dict) -> list[str]:
    """The tasks a command line runs Luigi task ``name`` (``Evaluate``) for, with its parameters ``given``
    (``task``, and ``split``, ``corpus``, ``audio`` when the command line names them): ``[task]`` when
    ``--task`` names an instance the config's pipeline has; every task's instance when a multi-task config
    is given none (``deepspeech-train Evaluate --config multi.yaml``, ``make train``); ``[""]`` (no
    ``--task``) for a stage without tasks, a task that runs every instance itself (``Features``) and a
    single-task config. PreflightError naming ``--task`` (or the task's missing key) otherwise."""
    src, task = config.source, given.get("task") or ""
    stage = next((s for s in STAGES.values() if name in (s.task, s.group)), None)
    if stage is not None and "task" not in stage.params and task:
        raise PreflightError(f"{src}: --task {task}: {name} is one stage over every task; give no --task")
    if stage is None or "task" not in stage.params:
        return [""]
    if task and not config.tasks:
        raise PreflightError(f"{src}: --task {task}: this config has no multitask.tasks; give no --task")
    if task and task not in config.tasks:
        raise PreflightError(
            f"{src}: --task {task}: multitask.tasks has no task {task!r}; its tasks: "
            f"{', '.join(config.tasks)}"
        )
    if name == stage.group or not config.tasks:
        return [task]
    if any(not given.get(p) for p in stage.params if p != "task"):
        return [task]  # Luigi names the missing parameter
    found = [params.get("task", "") for params in instances(config, stage, given)]
    for each in found if stage.name == "evaluate" else ():
        view = config.task_view(each, source=task_source(config, each))
        if not view.has_split("test"):
            raise PreflightError(
                f"{view.source}: data.test_files: Evaluate scores the test split and the task gives none "
                f"(data.test_files, or data.corpora with one)"
            )
    if task and task not in found:
        raise PreflightError(f"{src}: --task {task}: {_no_instance(config, stage.name, task)}")
    if not found:
        raise PreflightError(f"{src}: no task of multitask.tasks runs {name}")
    return found


def _no_instance(config: Config, stage: str, task: str) -> str:
    """Why the pipeline has no instance of ``stage`` for ``task``, one of its tasks."""
    entry = config.multitask.task(task)
    view = config.task_view(task)
    if stage in ("export", "transcribe") and not entry.export:
        return "the task has export: false (it is trained and evaluated, never exported)"
    if stage == "phonemes":
        return "the task has no targets: phonemes"
    if stage == "alphabet" and config.multitask.sharing == "shared":
        return "with multitask.sharing: shared one Alphabet builds every task's: run Alphabet without --task"
    if stage == "alphabet":
        return f"the task's paths.alphabet is {view.paths.alphabet} (Alphabet builds only auto)"
    if stage == "tune":
        return "the task's decoder.tune is off"
    return f"the pipeline has no {STAGES[stage].task} for it"


def _check_inputs(config: Config, layout: Layout) -> None:
    placeholders = sorted({key for key, path in input_paths(config) if _is_placeholder(path)})
    if placeholders:
        raise PreflightError(
            f"{config.source}: {', '.join(placeholders)} still hold the template's placeholder "
            f"paths; copy the file (or write one with `extends:` it) and set "
            f"{', '.join(placeholders)} to your own files (DeepSpeech CSV manifests, corpus folders, LM text)"
        )
    for key, path in input_paths(config):
        if not Path(path).exists():
            raise PreflightError(f"{config.source}: {key}: {path} does not exist")
    if not config.data.train_files and not config.data.corpora:
        raise PreflightError(
            f"{config.source}: data.train_files: no training manifest (nor data.corpora) given"
        )
    # A multi-task config's tasks are checked when it loads (config_checks.validate_tasks).
    if config.decoder.tune and not config.tasks and not config.has_split("dev"):
        raise PreflightError(
            f"{config.source}: decoder.tune: TuneDecoder searches on the dev split and this config gives "
            f"none (data.dev_files, or data.corpora with one)"
        )
    for key in layout.corpora:
        layout.import_plan(key)  # a corpus that is not what its importer reads: one line (ConfigError)
    if config.decoder.lm_builder == "kenlm" and not config.decoder.lm_path and find_tools() is None:
        raise PreflightError(f"{config.source}: {TOOLS_MISSING}")


def check_scheduler(host: str, port: int, timeout_s: float = 3.0) -> None:
    """Raise PreflightError when nothing listens at the central scheduler's address."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as error:
        raise PreflightError(
            f"no Luigi scheduler at {host}:{port} ({error.strerror or error}); start one with "
            f"`make scheduler` (or luigid), or pass --local-scheduler"
        ) from None
