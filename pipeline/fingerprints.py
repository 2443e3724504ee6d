"""What a stage instance's fingerprint hashes, apart from where its output goes (``pipeline.layout``).

A fingerprint is the hash of three things: the config keys tagged with the stage (``stage_keys``: the
schema's ``stages=`` tags, paths by their content's digest), what the stage depends on beyond the keys
(``derived_inputs``: its declaration's ``derived``, e.g. an Import's corpus files, a phonemes task's
manifests, the family's output rate, the objective's too-short rule) and the fingerprints of its upstream
stages (its declaration's ``upstream``; ``pipeline.dag``). Never the
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
from pipeline.dag import stage, tag_applies
from pipeline.digests import path_digest


class FingerprintInputs(Protocol):
    """What the fingerprint of a config's stage reads beyond the config (a ``Layout`` is one)."""

    config: Config
    alphabet: Path
    init_from_digest: str | None

    def input_digest(self, path: str) -> str:
        """The digest of an input file, remembered as the one the fingerprints used."""

    def import_fingerprint(self, key: str) -> str:
        """The digest of corpus ``key``'s import settings and files."""

    def aligner(self, key: str) -> Path:
        """What ``align.model`` of corpus ``key`` names (a ``recordings`` corpus)."""

    def model_fingerprint(self, named: str | Path) -> str:
        """The digest of a model a stage runs, or of the config whose export it is."""

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
                value = [
                    task.train_key(config.model) for task in value
                ]  # their data reaches Train by its inputs
            elif (section_field.name, f.name) == ("training", "init_from") and value is not None:
                value = inputs.init_from_digest
            elif f.metadata.get("path") and value is not None:

                def content(path, located=f.metadata.get("located")):
                    digest = inputs.input_digest(path)
                    return [str(path), digest] if located else digest

                value = [content(p) for p in value] if isinstance(value, tuple) else content(value)
            found[f"{section_field.name}.{f.name}"] = _plain(value)
    return found


def derived_inputs(inputs: FingerprintInputs, name: str, params: dict) -> dict:
    """What a stage's result depends on beyond the config's keys, as its declaration resolves it
    (``Stage.derived``: an Import's corpus files, the family's output stride, ...). Never the machine's:
    the builder that made an LM and espeak-ng's version are in the stages' reports."""
    return stage(name).derived(inputs, params)
