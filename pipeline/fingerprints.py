"""What a stage instance's fingerprint hashes, apart from where its output goes (``pipeline.layout``).

A fingerprint is the hash of three things: the config keys tagged with the stage (``stage_keys``: the
schema's ``stages=`` tags, paths by their content's digest), what the stage depends on beyond the keys
(``derived_inputs``: an Import's corpus files, a phonemes task's manifests, the family's output rate, the
objective's too-short rule) and the fingerprints of its upstream stages (``pipeline.dag``). Never the
machine's: which tools are on PATH, their versions, the clock (the stages' reports record those).
``Layout.fingerprint`` puts them together, once per instance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Protocol

from pipeline.config import Config, field_stages
from pipeline.dag import tag_applies
from pipeline.digests import path_digest
from pipeline.model import model_family
from pipeline.model.objectives import model_objective


class FingerprintInputs(Protocol):
    """What the fingerprint of a config's stage reads beyond the config (a ``Layout`` is one)."""

    config: Config
    alphabet: Path
    init_from_digest: str | None

    def input_digest(self, path: str) -> str:
        """The digest of an input file, remembered as the one the fingerprints used."""

    def import_fingerprint(self, key: str) -> str:
        """The digest of corpus ``key``'s import settings and files."""

    def for_task(self, name: str) -> FingerprintInputs:
        """The inputs of task ``name`` of a multi-task config."""


def fingerprint_hash(payload: dict) -> str:
    """The 12 hex digits of a fingerprint: SHA-256 of the payload as sorted JSON."""
    text = json.dumps(payload, sort_keys=True, default=list)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def node_name(name: str, params: dict, task: str) -> str:
    """An upstream instance as a fingerprint names it: its stage and parameters, without the task when it
    is the reading instance's own, so that a task's stages hash as a single-task config's with the same
    settings do (and share their outputs: a task's features are those of a run on its data alone)."""
    if task and params.get("task") == task:
        params = {k: v for k, v in params.items() if k != "task"}
    return f"{name}{sorted(params.items())}"


def _plain(value):
    """A config value as JSON can hold it (a group of keys or an entry of a list of mappings as a dict)."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
        return [dataclasses.asdict(item) for item in value]
    return value


def _family_keys(settings) -> object:
    """A model family's settings as fingerprinted: its Settings without the fields tagged ``stages=()``;
    a family without Settings, () (an empty list, as the old untyped ``model.options`` hashed)."""
    if not dataclasses.is_dataclass(settings):
        return settings
    return {
        f.name: _plain(getattr(settings, f.name))
        for f in dataclasses.fields(settings)
        if f.metadata.get("stages") != ()
    }


def stage_keys(inputs: FingerprintInputs, stage: str, params: dict) -> dict:
    """``{"section.key": value}`` of every config key whose ``stages`` tag names this stage instance;
    a path is given with its content's digest, a front end's settings as they are written."""
    config, found = inputs.config, {}
    for section_field in dataclasses.fields(config):
        if section_field.name in ("source", "task"):
            continue
        section = getattr(config, section_field.name)
        for f in dataclasses.fields(section):
            if "doc" not in f.metadata and not f.metadata.get("frontend") and not f.metadata.get("family"):
                continue
            if f.metadata.get("frontend"):
                tags = type(section).STAGES
            else:
                tags = field_stages(type(section), f.name, config)
            if not any(tag_applies(tag, stage, params) for tag in tags):
                continue
            value = getattr(section, f.name)
            if f.metadata.get("keyed_by"):  # only the entry this stage instance is about
                value = tuple(item for item in value if item.key == params.get(f.metadata["keyed_by"]))
            if f.metadata.get("frontend"):
                value = dataclasses.asdict(value)
            elif f.metadata.get("family"):
                value = _family_keys(value)
            elif (section_field.name, f.name) == ("paths", "alphabet"):
                value = path_digest(inputs.alphabet)
            elif (section_field.name, f.name) == ("multitask", "tasks"):
                value = [task.train_key() for task in value]  # their data reaches Train by its inputs
            elif (section_field.name, f.name) == ("training", "init_from") and value is not None:
                value = inputs.init_from_digest
            elif f.metadata.get("path") and value is not None:

                def content(path, located=f.metadata.get("located")):
                    digest = inputs.input_digest(path)
                    return [str(path), digest] if located else digest

                value = [content(p) for p in value] if isinstance(value, tuple) else content(value)
            found[f"{section_field.name}.{f.name}"] = _plain(value)
    return found


def derived_inputs(inputs: FingerprintInputs, stage: str, params: dict) -> dict:
    """What a stage's result depends on beyond the config's keys: an Import's corpus as resolved (its
    root, parts and options) and its files' names, sizes and modification times; a phonemes task's
    inputs; the family's output stride and the objective's too-short rule; for Train, global normalisation
    inside the model. The builder that made an LM
    and espeak-ng's version are the machine's: the stages' reports record them."""
    config = inputs.config
    if stage == "lm":
        # decoder.lm_builder as written: auto stays auto whichever builder it finds (lm_report.json says
        # which).
        return {"lm_builder": config.decoder.lm_builder}
    if stage == "import":
        return {"corpus": inputs.import_fingerprint(params["corpus"])}
    if stage == "phonemes":
        return _phonemes_inputs(inputs)
    if stage == "train" and config.features.normalize == "global":
        # The statistics are weights of the model (pipeline.model.normalization): its checkpoints and
        # exports hold them, as those of runs that normalised outside the model did not.
        return {"normalization": "in_model"}
    if stage == "features":
        # The too-short check counts the family's output labels by the objective's rule: nothing is added
        # for one label per frame and CTC's rule, so those caches keep their names.
        stride = model_family(config.model.architecture).stride(config.model)
        rule = model_objective(config.model.objective).data_rule
        return {
            **({"output_stride": stride} if stride != 1 else {}),
            **({"too_short_rule": rule} if rule != "ctc" else {}),
        }
    return {}


def _phonemes_inputs(inputs: FingerprintInputs) -> dict:
    """What a phonemes task's IPA manifests depend on beyond its upstream imports: its ``of`` task's
    manifest files (by content) and text settings (its language is the voice), the limits (only the
    rows they take are spoken). Not espeak-ng's version, which is the machine's: the stage's report
    records it (``phonemes_report.json``)."""
    config = inputs.config
    source = inputs.for_task(config.phonemes_of)
    return {
        "of": config.phonemes_of,
        "manifests": {
            split: [[path, inputs.input_digest(path)] for path in source.config.split_files(split)]
            for split in ("train", "dev", "test")
        },
        "text": source.config.data.text.to_dict(),
    }
