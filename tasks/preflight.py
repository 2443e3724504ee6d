"""Checks before any task runs: the config loads, every input file it names exists, a scheduler answers.

Each failure is one line naming the file or key and what to do, so that a run
never starts (and leaves nothing behind) when it could not finish.
"""

from __future__ import annotations

import socket
from pathlib import Path

from pipeline.config import Config, is_transducer
from pipeline.config_checks import task_source
from pipeline.dag import instances, stage, stages_by_task, upstream
from pipeline.data.phonemes import PhonemizerError, check_voice, phoneme_voice
from pipeline.layout import Layout
from pipeline.lm.kenlm_tools import TOOLS_MISSING, find_tools
from pipeline.train.cluster import check_shared_work_dir, cluster_size


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
    stage = stages_by_task().get(name)
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


def _no_instance(config: Config, name: str, task: str) -> str:
    """Why the pipeline has no instance of stage ``name`` for ``task``, one of its tasks."""
    entry = config.multitask.task(task)
    view = config.task_view(task)
    if name in ("export", "transcribe") and not entry.export:
        return "the task has export: false (it is trained and evaluated, never exported)"
    if name == "phonemes":
        return "the task has no targets: phonemes"
    if name == "alphabet" and config.multitask.sharing == "shared":
        return "with multitask.sharing: shared one Alphabet builds every task's: run Alphabet without --task"
    if name == "alphabet":
        return f"the task's paths.alphabet is {view.paths.alphabet} (Alphabet builds only auto)"
    if name in ("tune", "lm") and is_transducer(view):
        return f"the task's model.objective is {view.model.objective}: it reads no language model"
    if name == "tune":
        return "the task's decoder.tune is off"
    return f"the pipeline has no {stage(name).task} for it"


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


def reads_train(config: Config, name: str) -> bool:
    """Whether stage ``name`` is Train or reads what it trains, through the stages it reads (their
    declared upstream)."""
    seen, todo = set(), [name]
    while todo:
        node = todo.pop()
        if node == "train":
            return True
        if node not in seen:
            seen.add(node)
            # Which stages an instance reads does not depend on its parameters' values: none is given.
            unnamed = dict.fromkeys(stage(node).params, "")
            todo.extend(upstream_name for upstream_name, _ in upstream(config, node, unnamed))
    return False


# The stages that exist for a language model's decoding only.
LM_READERS = ("tune",)


def check_objective_reach(config: Config, name: str) -> None:
    """A model whose objective emits no CTC label scores (the transducer) has no language model to tune:
    a command whose Luigi task ``name`` is TuneDecoder is refused in one line when no task of the config
    has CTC's label scores (everything else, Export and Transcribe included, takes it; a multi-task
    config's transducer tasks have no TuneDecoder instance, ``pipeline/stages/tune.py``)."""
    from pipeline.model.objective import CTC_OUTPUT
    from pipeline.model.objectives import model_objective

    objective = model_objective(config.model.objective)
    stage = stages_by_task().get(name)
    if stage is None or stage.name not in LM_READERS:
        return
    views = [config.task_view(task) for task in config.tasks] or [config]
    if any(model_objective(view.model.objective).emits == CTC_OUTPUT for view in views):
        return
    raise PreflightError(
        f"{config.source}: model.objective: {config.model.objective}: {name} tunes a language model's "
        f"weights, and a {objective.emits} reads no language model; run Export or Evaluate "
        f"(luigi --module tasks Export --config {config.source})"
    )


def runs_train(config: Config, name: str) -> bool:
    """Whether the command's Luigi task ``name`` would run Train: it is Train or reads its model, and the
    Train run has no report that covers ``training.epochs`` (a damaged one: Train runs and says so)."""
    from pipeline.reports import ReportError, TrainReport, read_report
    from pipeline.train.epochs import training_done

    stage = stages_by_task().get(name)
    if stage is None or not reads_train(config, stage.name):
        return False
    report = Layout(config).train_run.report
    try:
        return not (
            report.is_file() and training_done(config.training.epochs, read_report(report, TrainReport))
        )
    except ReportError:
        return True


def tensorflow_gpus(environ: dict | None = None) -> int:
    """The GPUs TensorFlow will use, counted without starting it: none with its CPU-only build
    (tensorflow-cpu), else the visible ones (``tasks.resources.visible_gpus``)."""
    import importlib.metadata

    from tasks.resources import visible_gpus

    try:
        importlib.metadata.distribution("tensorflow-cpu")
        return 0
    except importlib.metadata.PackageNotFoundError:
        return visible_gpus(environ)


def train_towers(config: Config, gpus: int, environ: dict | None = None) -> tuple[int, str]:
    """(the towers Train will have, what makes them) with ``gpus`` GPUs visible, by the rule of
    ``pipeline.train.distribute.make_strategy``: every worker's GPUs (or its CPU) with multi_worker, the
    GPUs with mirrored (or auto with several), the ``cpu_devices`` without GPUs, else one device."""
    distribution = config.distribution
    devices = f"{gpus} GPU(s)" if gpus else "no GPU"
    if distribution.strategy == "multi_worker":
        workers = distribution.local_workers or cluster_size(config, environ)
        each = f"{gpus} GPU(s)" if gpus else "the CPU"
        return workers * max(gpus, 1), f"multi_worker: {workers} worker(s) x {each}"
    if distribution.strategy == "one_device":
        return 1, "distribution.strategy one_device"
    if gpus and (distribution.strategy == "mirrored" or gpus > 1):
        return gpus, f"{distribution.strategy} over {devices}"
    if not gpus and distribution.cpu_devices > 1:
        return (
            distribution.cpu_devices,
            f"{distribution.strategy} over distribution.cpu_devices {distribution.cpu_devices}",
        )
    return 1, f"{distribution.strategy} with {devices}: one device"


def check_training(config: Config, name: str, gpus: int | None = None, environ: dict | None = None) -> None:
    """When the command runs Train (``runs_train``): the settings Train would refuse only once it started,
    each one line naming the key: ``distribution.local_workers`` without ``strategy: multi_worker``, a
    ``training.hooks`` module that cannot be found (looked up, not imported), a
    ``training.global_batch_size`` that does not split over the towers Train will have (``train_towers``)."""
    from native_client.plugins import builtin_names, module_of, plugin_exists

    if not runs_train(config, name):
        return
    src, distribution, training = config.source, config.distribution, config.training
    if distribution.local_workers and distribution.strategy != "multi_worker":
        raise PreflightError(
            f"{src}: distribution.local_workers: {distribution.local_workers} worker processes need "
            f"distribution.strategy: multi_worker (it is {distribution.strategy}); set it, or "
            f"local_workers: 0"
        )
    for hook in training.hooks:
        if not plugin_exists("pipeline.train", hook):
            built_in = ", ".join(builtin_names("pipeline.train", "TRAIN_HOOKS")) or "none"
            raise PreflightError(
                f"{src}: training.hooks: no module {module_of('pipeline.train', hook)!r}; built in: "
                f"{built_in} (or the dotted name of an importable module of your own)"
            )
    if training.global_batch_size:
        towers, why = train_towers(config, tensorflow_gpus(environ) if gpus is None else gpus, environ)
        if training.global_batch_size % towers:
            raise PreflightError(
                f"{src}: training.global_batch_size: {training.global_batch_size} does not split over the "
                f"{towers} towers Train will have ({why}); use a multiple of {towers}, or set "
                f"training.batch_size (per tower) instead"
            )


def check_resources(command_lines: list[list[str]], totals: dict[str, int], where: str) -> None:
    """PreflightError when a task of the DAG a Luigi command line of ``command_lines`` (``--module tasks
    <Task> ...``) runs asks more of a resource than the scheduler at ``where``, granting ``totals``, ever
    can (``tasks.resources.ungrantable``): its worker would wait for it forever."""
    from luigi.cmdline_parser import CmdlineParser

    from tasks.reenable import dag
    from tasks.resources import ungrantable

    for line in command_lines:
        with CmdlineParser.global_instance(line) as parser:
            problem = ungrantable(dag([parser.get_task_obj()]).values(), totals, where)
        if problem:
            raise PreflightError(problem)


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
