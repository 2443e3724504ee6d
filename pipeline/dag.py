"""The DAG, declared once: each stage's upstream stages. Its config keys are tagged in the schema.

A stage's fingerprint (``pipeline.layout.Layout.fingerprint``) hashes the config
keys whose ``stages`` tag names it (``pipeline.config``: ``_opt(..., stages=...)``),
the digests of the input files among them, the few values the layout resolves
for it from the config and the data (``pipeline.fingerprints.derived_inputs``: a corpus's files, a
family's output stride; never what the machine has: tools on PATH, their
versions, the clock), and the fingerprints of the stages ``upstream`` lists;
the Luigi tasks' ``requires()`` come from the same ``upstream``
(``tasks.base``). So a stage's dependencies are written in one place, and
neither the tasks nor the layout repeat them.

To add a stage: a function in ``pipeline/stages/<name>.py``, an entry here, the
``stages`` tag on the keys it reads, a thin task in ``tasks/`` naming it.

A multi-task config (``multitask.tasks``) has an instance of each stage that depends on one task per
task (the ``task`` parameter: ``--task fr``) and one Train over all of them; the instance's config keys
are its task's view (``Config.task_view``), so changing task fr's data moves fr's stages, Train and what
follows, never en's. A single-task config's instances have no task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.config import Config

SPLITS = ("train", "dev", "test")

# (stage name, its parameters) of one stage instance: ("features", {"split": "dev"})
Node = tuple[str, dict]


@dataclass(frozen=True)
class Stage:
    """One stage of the DAG: its name (the tag its config keys carry), the task that runs it, its
    parameters, the stages whose outputs it reads, the task that runs all its instances, and whether a
    config's pipeline has an instance."""

    name: str
    task: str  # the Luigi task that runs it (tasks/)
    params: tuple[str, ...] = ()
    upstream: Callable[[Config, dict], list[Node]] = field(default=lambda config, params: [])
    # The Luigi task that runs every instance of a stage with parameters (Features: every split).
    group: str = ""
    # Whether the config's pipeline has this instance: the DAG's roots are the instances it has that no
    # other one reads (``make rerun`` runs them).
    runs: Callable[[Config, dict], bool] = field(default=lambda config, params: True)


def task_param(params: dict | None) -> dict:
    """``{"task": name}`` of a stage instance of a multi-task config's task; ``{}`` otherwise (a
    single-task pipeline's instances have no task, so their fingerprints are what they always were)."""
    return {"task": params["task"]} if params and params.get("task") else {}


def task_config(config: Config, params: dict | None) -> Config:
    """The config a stage instance reads: its task's view (``Config.task_view``), else ``config``."""
    task = task_param(params)
    return config.task_view(task["task"]) if task else config


def shared_alphabet(config: Config) -> bool:
    """Whether the tasks of a multi-task config share one alphabet (``multitask.sharing: shared``): one
    Alphabet instance, without a task, reads every task's transcripts."""
    return bool(config.tasks) and config.multitask.sharing == "shared"


def _is_instance(config: Config, params: dict) -> bool:
    """Whether an instance's task fits the config: one of its tasks in a multi-task config, none else."""
    task = task_param(params).get("task")
    return task in config.tasks if config.tasks else task is None


def _imports(config: Config, params: dict | None = None) -> list[Node]:
    """The Import of every corpus of the task's ``data.corpora`` (``data.corpora``): the manifests its
    Features splits and LM text read (none for a phonemes task: see ``_sources``)."""
    view = task_config(config, params)
    if view.phonemes_of:
        return []
    return [("import", {"corpus": corpus.key, **task_param(params)}) for corpus in view.data.corpora]


def _sources(config: Config, params: dict | None = None) -> list[Node]:
    """Where the manifests of the instance's task come from: its imports, or for a phonemes task
    (``targets: phonemes``) the Phonemes stage that writes them from its ``of`` task's."""
    if task_config(config, params).phonemes_of:
        return [("phonemes", task_param(params))]
    return _imports(config, params)


def _phonemes_inputs(config: Config, params: dict) -> list[Node]:
    """What the Phonemes stage reads: the imports of its ``of`` task."""
    return _imports(config, {"task": task_config(config, params).phonemes_of})


def _alphabet(config: Config, params: dict | None = None) -> list[Node]:
    """The Alphabet stage, for the stages that read the alphabet, when it builds it (``paths.alphabet:
    auto``): the task's own, or the one every task shares; a hand-written alphabet is a file their
    fingerprints digest instead."""
    if not task_config(config, params).alphabet_auto:
        return []
    return [("alphabet", {} if shared_alphabet(config) else task_param(params))]


def _alphabet_inputs(config: Config, params: dict) -> list[Node]:
    """What the Alphabet stage reads: the task's imports; with one shared alphabet, every task's."""
    if shared_alphabet(config) and not task_param(params):
        return [node for task in config.tasks for node in _sources(config, {"task": task})]
    return _sources(config, params)


def _alphabet_runs(config: Config, params: dict) -> bool:
    """Whether the pipeline has this Alphabet instance: the task's alphabet is built (``auto``), by an
    instance of its own, or by the one without a task that every task shares."""
    if shared_alphabet(config):
        return not task_param(params) and config.task_view(config.tasks[0]).alphabet_auto
    return _is_instance(config, params) and task_config(config, params).alphabet_auto


def _train(config: Config, params: dict) -> list[Node]:
    """The train features, and the dev features when there is a dev split (without one, no validation), and
    the Alphabet stage when it builds the alphabet: of every task in a multi-task config."""
    nodes: list[Node] = []
    for task in config.tasks or ("",):
        task_params = {"task": task} if task else {}
        view = task_config(config, task_params)
        splits = [split for split in ("train", "dev") if split == "train" or view.has_split(split)]
        nodes += [("features", {"split": split, **task_params}) for split in splits]
        nodes += [node for node in _alphabet(config, task_params) if node not in nodes]
    return nodes


def _decoding(config: Config, params: dict | None = None) -> list[Node]:
    """What decoding with the LM needs: the LM, and the tuned weights when ``decoder.tune`` is on."""
    task = task_param(params)
    return [("lm", task)] + ([("tune", task)] if task_config(config, params).decoder.tune else [])


def _exported(config: Config, params: dict) -> bool:
    """Whether the pipeline exports the instance's task (``multitask.tasks[].export``)."""
    task = task_param(params).get("task")
    return task is None or config.multitask.task(task).export


def _average_dev(config: Config, params: dict | None = None) -> list[Node]:
    """The dev features, for Evaluate's dev figures of an averaged model (``export.average``): of the
    instance's task, when it has a dev split."""
    if not (config.export.average.count and task_config(config, params).has_split("dev")):
        return []
    return [("features", {"split": "dev", **task_param(params)})]


STAGES: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage(
            "import",
            "Import",
            params=("corpus", "task"),
            group="Imports",
            runs=lambda config, params: (
                _is_instance(config, params)
                and any(node[1]["corpus"] == params["corpus"] for node in _imports(config, params))
            ),
        ),
        Stage(
            "phonemes",
            "Phonemes",
            params=("task",),
            upstream=_phonemes_inputs,
            runs=lambda config, params: (
                _is_instance(config, params) and bool(task_config(config, params).phonemes_of)
            ),
        ),
        Stage(
            "alphabet",
            "Alphabet",
            params=("task",),
            upstream=_alphabet_inputs,
            runs=lambda config, params: _alphabet_runs(config, params),
        ),
        Stage(
            "features",
            "FeaturesSplit",
            params=("split", "task"),
            upstream=lambda config, params: [*_sources(config, params), *_alphabet(config, params)],
            group="Features",
            runs=lambda config, params: (
                _is_instance(config, params)
                and (params["split"] == "train" or task_config(config, params).has_split(params["split"]))
            ),
        ),
        Stage("train", "Train", upstream=_train),
        Stage(
            "lm",
            "LanguageModel",
            params=("task",),
            upstream=lambda config, params: [*_sources(config, params), *_alphabet(config, params)],
            runs=lambda config, params: _is_instance(config, params),
        ),
        Stage(
            "tune",
            "TuneDecoder",
            params=("task",),
            upstream=lambda config, params: [
                ("train", {}),
                ("lm", task_param(params)),
                ("features", {"split": "dev", **task_param(params)}),
                *_alphabet(config, params),
            ],
            runs=lambda config, params: (
                _is_instance(config, params) and task_config(config, params).decoder.tune
            ),
        ),
        Stage(
            "evaluate",
            "Evaluate",
            params=("task",),
            upstream=lambda config, params: [
                ("train", {}),
                ("features", {"split": "test", **task_param(params)}),
                *_average_dev(config, params),
                *_decoding(config, params),
                *_alphabet(config, params),
            ],
            runs=lambda config, params: _is_instance(config, params),
        ),
        Stage(
            "export",
            "Export",
            params=("task",),
            upstream=lambda config, params: [
                ("train", {}),
                *_decoding(config, params),
                *_alphabet(config, params),
                *([("evaluate", task_param(params))] if config.export.card.evaluation else []),
            ],
            runs=lambda config, params: _is_instance(config, params) and _exported(config, params),
        ),
        Stage(
            "transcribe",
            "Transcribe",
            params=("audio", "task"),
            upstream=lambda config, params: [("export", task_param(params))],
            runs=lambda config, params: (
                bool(params["audio"]) and _is_instance(config, params) and _exported(config, params)
            ),
        ),
    )
}


def instances(config: Config, stage: Stage, given: dict) -> list[dict]:
    """The parameters of every instance of ``stage`` the config's pipeline has (``Stage.runs``) with the
    values ``given``: a stage with a parameter other than the task only when it is given; a stage that
    takes a task, for the task given, else for every task of a multi-task config (and without one, where the
    config's pipeline has that instance)."""
    values = {p: given.get(p) for p in stage.params if p != "task"}
    if not all(values.values()):
        return []
    # A multi-task config's stage may also have an instance without a task: the one Alphabet every task
    # shares (``multitask.sharing: shared``).
    tasks = (given["task"],) if given.get("task") else ("", *config.tasks)
    found = []
    for task in tasks if "task" in stage.params else ("",):
        params = {**values, **({"task": task} if task else {})}
        if stage.runs(config, params):
            found.append(params)
    return found


def upstream(config: Config, name: str, params: dict | None = None) -> list[Node]:
    """The stage instances ``name`` (with ``params``) reads, as the declaration gives them."""
    return STAGES[name].upstream(config, dict(params or {}))


def describe_tag(tag: str) -> str:
    """A stage tag as a user reads it: the task's name, with the parameter (``FeaturesSplit(train)``)."""
    stage, _, value = tag.partition(":")
    return STAGES[stage].task + (f"({value})" if value else "")


def tag_applies(tag: str, name: str, params: dict) -> bool:
    """Whether a key's stage tag (``train``, ``features:dev``) names the stage instance (name, params)."""
    stage, _, value = tag.partition(":")
    if stage != name:
        return False
    return not value or value in {str(v) for v in params.values()}
