"""The DAG's vocabulary, and the DAG itself found from the stages' own declarations.

Each stage declares itself once, in its own module: ``pipeline/stages/<module>.py`` has a ``STAGE``
(a ``Stage``: its name, which is the tag its config keys carry, its parameters, the stages whose
outputs it reads, whether a config's pipeline has an instance, what its result depends on beyond
config keys), beside the stage function; ``tasks/<module>.py`` has the Luigi task that runs it.
``stages()`` finds the declarations in ``pipeline/stages`` at run time (as families and front ends are
found by name: the one place this floor reaches the stages' own, so the import layers do not see it),
and the DAG, its roots, the Luigi tasks, gc's stage folders and ``make rerun`` all come from them: no
list of stages is kept anywhere else.

A stage's fingerprint (``pipeline.layout.Layout.fingerprint``) hashes the config keys whose
``stages`` tag names it (``pipeline.config``), what its declaration ``derived`` resolves (never what
the machine has: tools on PATH, their versions, the clock) and the fingerprints of the instances its
``upstream`` lists; the Luigi tasks' ``requires()`` come from the same ``upstream`` (``tasks.base``).
What re-runs a stage is therefore its tagged keys and its declaration, nothing else.

A multi-task config (``multitask.tasks``) has an instance of each stage that depends on one task per
task (the ``task`` parameter: ``--task fr``) and one Train over all of them; the instance's config keys
are its task's view (``Config.task_view``), so changing task fr's data moves fr's stages, Train and what
follows, never en's. A single-task config's instances have no task.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from native_client.plugins import builtin_names
from pipeline.config import Config, is_transducer

if TYPE_CHECKING:
    from pipeline.fingerprints import FingerprintInputs
    from pipeline.layout import Layout

SPLITS = ("train", "dev", "test")
# Where the stages declare themselves: a module of this package with a STAGE.
STAGE_PACKAGE = "pipeline.stages"

# (stage name, its parameters) of one stage instance: ("features", {"split": "dev"})
Node = tuple[str, dict]


@dataclass(frozen=True)
class Stage:
    """One stage of the DAG, as its module declares it (``STAGE``)."""

    name: str  # the tag its config keys carry (``stages=("train",)``), and its node name
    task: str  # the Luigi task that runs it: a class of ``tasks/<module>.py`` of that name
    params: tuple[str, ...] = ()
    # The stage instances an instance reads: its fingerprint's inputs and its Luigi requires().
    upstream: Callable[[Config, dict], list[Node]] = field(default=lambda config, params: [])
    # The Luigi task that runs every instance of a stage with parameters (Features: every split).
    group: str = ""
    # Whether the config's pipeline has this instance: the DAG's roots are the instances it has that no
    # other one reads (``make rerun`` runs them).
    runs: Callable[[Config, dict], bool] = field(default=lambda config, params: True)
    # What the result depends on beyond the config's tagged keys and the upstream fingerprints, resolved
    # from the config and the data (an Import's corpus files, the family's output stride), as JSON.
    derived: Callable[[FingerprintInputs, dict], dict] = field(default=lambda inputs, params: {})
    # The folder of the work directory its instances write in, which gc walks ("": it writes elsewhere,
    # as Export does), and the paths an instance writes there, the one its writer locks first.
    directory: str = ""
    outputs: Callable[[Layout, dict], list[Path]] = field(default=lambda layout, params: [])
    module: str = ""  # filled by ``stages()``: the module that declared it


@functools.cache
def stages() -> dict[str, Stage]:
    """Every stage of the DAG by name, in the order of their modules' names: the ``STAGE`` of each
    module of ``pipeline/stages`` that declares one (read once per process; where the sources are not
    shipped, every module is imported to see, and the train launcher's imports load TensorFlow). A stage
    module imports without TensorFlow: what its function needs that loads it, the function imports."""
    found: dict[str, Stage] = {}
    for module in _stage_modules():
        declared = getattr(importlib.import_module(f"{STAGE_PACKAGE}.{module}"), "STAGE", None)
        if declared is None:
            continue
        if declared.name in found:
            raise TypeError(
                f"{STAGE_PACKAGE}.{module}: stage {declared.name!r} is declared by "
                f"{found[declared.name].module} too"
            )
        found[declared.name] = dataclasses.replace(declared, module=module)
    if not found:
        raise TypeError(f"{STAGE_PACKAGE}: no module declares a STAGE")
    return found


def _stage_modules() -> list[str]:
    """The modules of ``pipeline/stages`` that may declare a stage: those whose source defines ``STAGE``
    (read, not imported: the others, gc's and the train launcher's, need not load), and any shipped
    without its source."""
    spec = importlib.util.find_spec(STAGE_PACKAGE)
    names = sorted(info.name for info in pkgutil.iter_modules(spec.submodule_search_locations))
    declaring = set(builtin_names(STAGE_PACKAGE, "STAGE"))
    return [
        name
        for name in names
        if name in declaring
        or not any((Path(p) / f"{name}.py").is_file() for p in spec.submodule_search_locations)
    ]


def stage(name: str) -> Stage:
    """The declaration of stage ``name``."""
    return stages()[name]


def stages_by_task() -> dict[str, Stage]:
    """Each stage by the names a command line gives it: the task that runs every instance of a stage
    with parameters (``Features``), then its task (``FeaturesSplit``), in the order of ``stages()``."""
    found: dict[str, Stage] = {}
    for declared in stages().values():
        found.update({declared.group: declared} if declared.group else {})
        found[declared.task] = declared
    return found


def pipeline_instances(config: Config, given: dict | None = None) -> list[Node]:
    """Every instance of every stage the config's pipeline has (``instances``) with the values
    ``given``."""
    return [
        (declared.name, params)
        for declared in stages().values()
        for params in instances(config, declared, dict(given or {}))
    ]


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


def is_instance(config: Config, params: dict) -> bool:
    """Whether an instance's task fits the config: one of its tasks in a multi-task config, none else."""
    task = task_param(params).get("task")
    return task in config.tasks if config.tasks else task is None


def imports_of(config: Config, params: dict | None = None) -> list[Node]:
    """The Import (or for long recordings the Align) of every corpus of the task's ``data.corpora``: the
    manifests its Features splits and LM text read (none for a phonemes task: see ``sources_of``)."""
    view = task_config(config, params)
    if view.phonemes_of:
        return []
    return [
        (corpus_stage(corpus), {"corpus": corpus.key, **task_param(params)}) for corpus in view.data.corpora
    ]


def corpus_stage(corpus) -> str:
    """The stage that writes a ``data.corpora`` entry's manifests: ``align`` for a corpus of long
    recordings, which has ``align:`` settings (the ``recordings`` importer needs them: the config loader
    says so), else ``import``."""
    return "align" if dict(corpus.options).get("align") is not None else "import"


def sources_of(config: Config, params: dict | None = None) -> list[Node]:
    """Where the manifests of the instance's task come from: its imports, or for a phonemes task
    (``targets: phonemes``) the Phonemes stage that writes them from its ``of`` task's."""
    if task_config(config, params).phonemes_of:
        return [("phonemes", task_param(params))]
    return imports_of(config, params)


def cleans(config: Config, split: str) -> bool:
    """Whether the Clean stage cleans ``split`` of this (task's) config: ``data.clean.model`` set and the
    split among ``data.clean.splits`` (a phonemes task's manifests are its ``of`` task's, not cleaned)."""
    clean = config.data.clean
    return bool(clean.model) and split in clean.splits and not config.phonemes_of


def manifests_of(config: Config, params: dict | None, split: str) -> list[Node]:
    """Where the manifests of ``split`` the instance's task reads come from: the Clean stage when it
    cleans that split, else the task's sources (``sources_of``)."""
    if cleans(task_config(config, params), split):
        return [("clean", task_param(params))]
    return sources_of(config, params)


def every_split_of(config: Config, params: dict | None = None) -> list[Node]:
    """Where the manifests of every split of the instance's task come from (``manifests_of``), each once."""
    found: list[Node] = []
    for split in SPLITS:
        found += [node for node in manifests_of(config, params, split) if node not in found]
    return found


def alphabet_of(config: Config, params: dict | None = None) -> list[Node]:
    """The Alphabet stage, for the stages that read the alphabet, when it builds it (``paths.alphabet:
    auto``): the task's own, or the one every task shares; a hand-written alphabet is a file their
    fingerprints digest instead."""
    if not task_config(config, params).alphabet_auto:
        return []
    return [("alphabet", {} if shared_alphabet(config) else task_param(params))]


def decoding_of(config: Config, params: dict | None = None) -> list[Node]:
    """What decoding with the LM needs: the LM, and the tuned weights when ``decoder.tune`` is on; nothing
    for a model whose objective emits what the LM decoders do not read (a transducer)."""
    if is_transducer(task_config(config, params)):
        return []
    task = task_param(params)
    return [("lm", task)] + ([("tune", task)] if task_config(config, params).decoder.tune else [])


def exported(config: Config, params: dict) -> bool:
    """Whether the pipeline exports the instance's task (``multitask.tasks[].export``)."""
    task = task_param(params).get("task")
    return task is None or config.multitask.task(task).export


def instances(config: Config, declared: Stage, given: dict) -> list[dict]:
    """The parameters of every instance of the ``declared`` stage the config's pipeline has
    (``Stage.runs``) with the values ``given``: a stage with a parameter other than the task only when it
    is given; a stage that takes a task, for the task given, else for every task of a multi-task config
    (and without one, where the config's pipeline has that instance)."""
    values = {p: given.get(p) for p in declared.params if p != "task"}
    if not all(values.values()):
        return []
    # A multi-task config's stage may also have an instance without a task: the one Alphabet every task
    # shares (``multitask.sharing: shared``).
    tasks = (given["task"],) if given.get("task") else ("", *config.tasks)
    found = []
    for task in tasks if "task" in declared.params else ("",):
        params = {**values, **({"task": task} if task else {})}
        if declared.runs(config, params):
            found.append(params)
    return found


def upstream(config: Config, name: str, params: dict | None = None) -> list[Node]:
    """The stage instances ``name`` (with ``params``) reads, as the declaration gives them."""
    return stage(name).upstream(config, dict(params or {}))


def describe_tag(tag: str) -> str:
    """A stage tag as a user reads it: the task's name, with the parameter (``FeaturesSplit(train)``)."""
    name, _, value = tag.partition(":")
    return stage(name).task + (f"({value})" if value else "")


def tag_applies(tag: str, name: str, params: dict) -> bool:
    """Whether a key's stage tag (``train``, ``features:dev``) names the stage instance (name, params)."""
    tagged, _, value = tag.partition(":")
    if tagged != name:
        return False
    return not value or value in {str(v) for v in params.values()}
