"""The DAG, declared once: each stage's upstream stages. Its config keys are tagged in the schema.

A stage's fingerprint (``pipeline.layout.Layout.fingerprint``) hashes the config
keys whose ``stages`` tag names it (``pipeline.config``: ``_opt(..., stages=...)``),
the digests of the input files among them, the few values the layout resolves
for it (``Layout._derived``: the LM builder ``auto`` stands for), and the
fingerprints of the stages ``upstream`` lists; the Luigi tasks' ``requires()``
come from the same ``upstream`` (``tasks.base``). So a stage's dependencies are
written in one place, and neither the tasks nor the layout repeat them.

To add a stage: a function in ``pipeline/stages/<name>.py``, an entry here, the
``stages`` tag on the keys it reads, a thin task in ``tasks/`` naming it.
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


def _imports(config: Config, params: dict | None = None) -> list[Node]:
    """Every corpus's Import (``data.corpora``): the manifests the Features splits and the LM text read."""
    return [("import", {"corpus": corpus.key}) for corpus in config.data.corpora]


def _alphabet(config: Config) -> list[Node]:
    """The Alphabet stage, for the stages that read the alphabet, when it builds it (``paths.alphabet:
    auto``); a hand-written alphabet is a file their fingerprints digest instead."""
    return [("alphabet", {})] if config.alphabet_auto else []


def _train(config: Config, params: dict) -> list[Node]:
    """The train features, and the dev features when there is a dev split (without one, no validation), and
    the Alphabet stage when it builds the alphabet."""
    splits = [split for split in ("train", "dev") if split == "train" or config.has_split(split)]
    return [("features", {"split": split}) for split in splits] + _alphabet(config)


def _decoding(config: Config) -> list[Node]:
    """What decoding with the LM needs: the LM, and the tuned weights when ``decoder.tune`` is on."""
    return [("lm", {})] + ([("tune", {})] if config.decoder.tune else [])


def _average_dev(config: Config) -> list[Node]:
    """The dev features, for Evaluate's dev figures of an averaged model (``export.average``)."""
    return [("features", {"split": "dev"})] if config.export.average.count and config.has_split("dev") else []


STAGES: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage(
            "import",
            "Import",
            params=("corpus",),
            group="Imports",
            runs=lambda config, params: any(c.key == params["corpus"] for c in config.data.corpora),
        ),
        Stage("alphabet", "Alphabet", upstream=_imports, runs=lambda config, params: config.alphabet_auto),
        Stage(
            "features",
            "FeaturesSplit",
            params=("split",),
            upstream=lambda config, params: [*_imports(config), *_alphabet(config)],
            group="Features",
            runs=lambda config, params: params["split"] == "train" or config.has_split(params["split"]),
        ),
        Stage("train", "Train", upstream=_train),
        Stage("lm", "LanguageModel", upstream=lambda config, params: [*_imports(config), *_alphabet(config)]),
        Stage(
            "tune",
            "TuneDecoder",
            upstream=lambda config, params: [
                ("train", {}),
                ("lm", {}),
                ("features", {"split": "dev"}),
                *_alphabet(config),
            ],
            runs=lambda config, params: config.decoder.tune,
        ),
        Stage(
            "evaluate",
            "Evaluate",
            upstream=lambda config, params: [
                ("train", {}),
                ("features", {"split": "test"}),
                *_average_dev(config),
                *_decoding(config),
                *_alphabet(config),
            ],
        ),
        Stage(
            "export",
            "Export",
            upstream=lambda config, params: [
                ("train", {}),
                *_decoding(config),
                *_alphabet(config),
                *([("evaluate", {})] if config.export.card.evaluation else []),
            ],
        ),
        Stage(
            "transcribe",
            "Transcribe",
            params=("audio",),
            upstream=lambda config, params: [("export", {})],
            runs=lambda config, params: bool(params["audio"]),
        ),
    )
}


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
