"""Reading configs: YAML files (with ``extends:``) and overrides -> a validated, frozen ``Config``.

Layering: dataclass defaults <- the ``extends:`` chain of YAML files (each
overriding a subset) <- explicit overrides -> validate -> freeze. Paths in a
file are relative to that file; symlinks are followed (a path is relative to the
real file a linked config points to). YAML anchors and merge keys (``<<: *name``)
work; top-level keys starting with ``x-`` are ignored, a place to define anchors.
Every error is one line naming the file, the key and what was expected. The
schema itself is ``pipeline.config``; each value is checked against its field by
``pipeline.config_values``.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from native_client.plugins import PluginError, builtin_names, plugin_exists
from pipeline.config import (
    Config,
    ConfigError,
    FeaturesConfig,
    ModelConfig,
    SectionOverride,
    is_deepspeech,
)
from pipeline.config_checks import named_plugin, task_source, validate_config, validate_tasks
from pipeline.config_values import SECTIONS, checked, did_you_mean, section_types
from pipeline.model.deepspeech import DeepSpeechSettings

# DeepSpeech's settings in DeepSpeech's own spelling, the ``model`` section's keys (``model.n_hidden``):
# each file's are read as ``model.deepspeech.<key>`` before the files merge.
DEEPSPEECH_KEYS = tuple(f.name for f in dataclasses.fields(DeepSpeechSettings))


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys (YAML would silently keep the last one) and takes YAML's
    merge key (``<<: *anchor``): a mapping's own keys override the merged ones, as YAML says."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # flatten_mapping (in the base class) merges these; only own keys must be unique
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (line {key_node.start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config file: {error.strerror}") from error
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return data


def _layer(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, dict[str, Any]]:
    """Read one file and its ``extends:`` chain into {section: {key: checked value}}."""
    path = path.resolve()
    if path in chain:
        raise ConfigError(f"{path}: extends: cycle through {' -> '.join(str(p) for p in chain)}")
    raw = _read_yaml(path)
    merged: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    parent = raw.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: extends: expected a file name, got {parent!r}")
        parent_path = Path(parent) if Path(parent).is_absolute() else path.parent / parent
        if not parent_path.exists():
            raise ConfigError(f"{path}: extends: file {parent_path} does not exist")
        if parent_path.is_dir():
            raise ConfigError(f"{path}: extends: {parent_path} is a directory; expected a YAML config file")
        merged = _layer(parent_path, chain + (path,))
    _merge_into(merged, raw, str(path), path.parent)
    return merged


# A top-level key starting with this is ignored: a place for YAML anchors that sections merge (``<<: *name``).
EXTENSION_PREFIX = "x-"
# Where a section keeps the keys it hands on to a plug-in (the front end's settings), checked at freeze time
# against the plug-in the final config names.
PENDING = "__plugin_keys__"


def _merge_into(merged: dict, raw: dict, source: str, base_dir: Path | None) -> None:
    types = section_types()
    for section, values in raw.items():
        if isinstance(section, str) and section.startswith(EXTENSION_PREFIX):
            continue
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown section {section!r}; expected one of {', '.join(SECTIONS)}")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: {section}: expected a mapping of keys")
        known = {f.name: f for f in dataclasses.fields(types[section]) if "doc" in f.metadata}
        hints = typing.get_type_hints(types[section])
        if section == "model":
            _refuse_both_spellings(values, source)
            families = builtin_names("pipeline.model", "FAMILY")  # read from the sources, not imported
        for key, value in values.items():
            where = f"{source}: {section}.{key}"
            if section == "model" and key in DEEPSPEECH_KEYS:
                block = merged[section].setdefault(PENDING, {}).setdefault("deepspeech", {})
                block[key] = (value, where, base_dir)
                continue
            if key not in known:
                if section == "features" and isinstance(key, str):
                    merged[section].setdefault(PENDING, {})[key] = (value, where, base_dir)
                    continue
                if (section, key) == ("model", "options"):
                    raise ConfigError(
                        f"{where}: a family's own settings go under model.<family>: (model.conformer: "
                        f"{{d_model: 256}}), not model.options"
                    )
                if section == "model" and isinstance(key, str):
                    # a built-in family's block may name it by its module (model.pipeline.model.deepspeech:)
                    bare = key.removeprefix("pipeline.model.")
                    family_block = bare in families
                    if family_block and not isinstance(value, dict | None):
                        raise ConfigError(f"{where}: expected a mapping of the {bare} family's settings")
                    if isinstance(value, dict) or family_block:
                        # a family's settings, checked at freeze time if that family is chosen; an empty
                        # block (every key commented out) is YAML's null
                        pending = merged[section].setdefault(PENDING, {})
                        block = pending.setdefault(bare if family_block else key, {})
                        block.update(
                            {
                                name: (item, f"{where}.{name}", base_dir)
                                for name, item in (value or {}).items()
                            }
                        )
                        continue
                names = [*known, *DEEPSPEECH_KEYS] if section == "model" else list(known)
                raise ConfigError(
                    f"{where}: unknown key; {did_you_mean(key, names)}expected one of {', '.join(names)}"
                )
            merged[section][key] = checked(value, hints[key], known[key].metadata, where, base_dir)
        if section == "model":
            _refuse_deepspeech_keys_of_another_family(merged["model"], values, source)


def _refuse_both_spellings(values: dict, source: str) -> None:
    """ConfigError when one file gives a DeepSpeech setting twice: as ``model.<key>``, under
    ``model.deepspeech:`` or under its module's name (which would win is not the file's to leave unsaid)."""
    spellings = {"model.": values}
    for block in ("deepspeech", "pipeline.model.deepspeech"):
        if isinstance(values.get(block), dict):
            spellings[f"model.{block}."] = values[block]
    for key in DEEPSPEECH_KEYS:
        given = [f"{prefix}{key}" for prefix, written in spellings.items() if key in written]
        if len(given) > 1:
            raise ConfigError(
                f"{source}: {' and '.join(given)}: one setting given twice in one file; keep one"
            )


def _refuse_deepspeech_keys_of_another_family(model: dict, values: dict, source: str) -> None:
    """A file (or the overrides) that sets DeepSpeech's keys in its spelling (``model.n_hidden``, ...) where
    the family is another, by its own ``model.architecture`` or the files it extends: ConfigError naming
    the key and the family, since that family would never read it. A base file's keys under a child that
    chooses another family are the base's, and are not read."""
    family = model.get("architecture", ModelConfig().architecture)
    if is_deepspeech(family):
        return
    for key in DEEPSPEECH_KEYS:
        if key in values:
            block = f"model.{family}:" if "." not in family else "model.<its name>:"
            raise ConfigError(
                f"{source}: model.{key}: a setting of the deepspeech family, in a config of the {family} "
                f"family, which does not read it (a family's own settings go under {block})"
            )


def _frontend_settings(values: dict, source: str):
    """The front end's Settings from the section's other keys, checked by the front end itself."""
    from native_client.frontends import frontend_class

    name = values.get("type", "mfcc")
    try:
        frontend = frontend_class(name)
    except (PluginError, TypeError) as error:
        raise ConfigError(f"{source}: {error}") from None
    known = {f.name: f for f in dataclasses.fields(frontend.Settings)}
    hints = typing.get_type_hints(frontend.Settings)
    settings = {}
    for key, (value, where, base_dir) in values.pop(PENDING, {}).items():
        if key not in known:
            common = [f.name for f in dataclasses.fields(FeaturesConfig) if "doc" in f.metadata]
            raise ConfigError(
                f"{where}: unknown key; {did_you_mean(key, common + list(known))}expected one of "
                f"{', '.join(common + list(known))} (the {name} front end's settings: {', '.join(known)})"
            )
        settings[key] = checked(value, hints[key], known[key].metadata, where, base_dir)
    built = frontend.Settings(**settings)
    try:
        frontend(built, values.get("sample_rate", FeaturesConfig().sample_rate))
    except ValueError as error:
        raise ConfigError(f"{source}: features.{error}") from None
    return built


def _family_settings(values: dict, source: str):
    """The chosen model family's Settings from its ``model.<family>:`` block (checked key by key and by
    the family), or () for a family without Settings. The block of a family not chosen is left unread;
    a block that names no family at all is an unknown key."""
    from pipeline.model import model_family

    name = values.get("architecture", ModelConfig().architecture)
    family = named_plugin(model_family, "pipeline.model", name, "model.architecture", "model family", source)
    blocks = values.pop(PENDING, {})
    # the chosen family's block: by its name, or by the module model.architecture names
    chosen = [key for key in blocks if key in (family.name, name)]
    for key, block in blocks.items():
        if key not in chosen and not plugin_exists("pipeline.model", key):
            where = next(iter(block.values()))[1].rsplit(".", 1)[0] if block else f"{source}: model.{key}"
            known = [f.name for f in dataclasses.fields(ModelConfig) if "doc" in f.metadata]
            raise ConfigError(
                f"{where}: unknown key; {did_you_mean(key, known + [family.name])}expected one of "
                f"{', '.join(known)}, or model.<family>: with a family's settings"
            )
    if family.Settings is None:
        if chosen:
            raise ConfigError(f"{source}: model.{chosen[0]}: the {name} family has no settings of its own")
        return ()
    known = {f.name: f for f in dataclasses.fields(family.Settings)}
    hints = typing.get_type_hints(family.Settings)
    settings = {}
    written = [item for key in chosen for item in blocks[key].items()]
    for key, (value, where, base_dir) in written:
        if key not in known:
            raise ConfigError(
                f"{where}: unknown key; {did_you_mean(key, known)}the {name} family's settings: "
                f"{', '.join(known)}"
            )
        settings[key] = checked(value, hints[key], known[key].metadata, where, base_dir)
    return family.Settings(**settings)


def _check_family(config: Config) -> None:
    """The chosen family's own check of its settings taken together."""
    from pipeline.model import model_family

    family = model_family(config.model.architecture)
    try:
        family.check(config.model)
    except ValueError as error:
        raise ConfigError(f"{config.source}: {error}") from None
    stride = family.stride(config.model)
    spec = family.stream_input(config.model, config.export.n_steps)
    if spec is not None and spec.chunk % stride:
        raise ConfigError(
            f"{config.source}: export.n_steps: {config.export.n_steps} frames per streaming call is not a "
            f"multiple of the {config.model.architecture} family's stride ({stride} frames per label)"
        )


def _freeze(merged: dict, source: str) -> Config:
    types = section_types()
    sections = {}
    for name, values in merged.items():
        values = dict(values)
        if name == "features":
            values["frontend"] = _frontend_settings(values, source)
        if name == "model":
            values["options"] = _family_settings(values, source)
        sections[name] = types[name](**values)
    config = Config(**sections, source=source)
    _check_family(config)
    validate_config(config)
    _check_corpora(config)
    validate_tasks(config)
    for name in config.tasks:
        view = config.task_view(name, source=task_source(config, name))
        if not view.phonemes_of:  # a phonemes task's corpora are its ``of`` task's, checked there
            _check_corpora(view)
    return config


def _check_corpora(config: Config) -> None:
    """``data.text`` and each ``data.corpora`` entry as the import will read them, so a mistake is one line
    when the config loads: the importer, its options, the split names and fractions, and, when the corpus
    folder exists, its parts (a glance at the folder's top levels; a missing folder is left to preflight
    and to the Import task, so that a template's placeholder paths load)."""
    from pipeline.data.importing import check_spec, corpus_error, corpus_spec, plan_import

    src = config.source
    try:
        config.data.text.check("data.text")
    except ValueError as error:
        raise ConfigError(f"{src}: {error}") from None
    keys: dict[str, int] = {}
    for index, corpus in enumerate(config.data.corpora):
        where = f"data.corpora[{index}]"
        if corpus.key in keys:
            raise ConfigError(
                f"{src}: {where}: its key {corpus.key!r} is also data.corpora[{keys[corpus.key]}]'s; "
                f"set name: on one of them"
            )
        keys[corpus.key] = index
        spec = corpus_spec(corpus, config.data.text)
        try:
            chosen, options, _ = check_spec(spec, where)
            if chosen.stage == "align":
                _check_model(options.align.model, f"{where}.align.model", src)
                _check_align(options.align, config.data.max_duration_s, f"{where}.align")
            if Path(corpus.path).is_dir():
                plan_import(spec, where)
        except ValueError as error:  # CorpusLayoutError and PluginError are ValueErrors
            raise corpus_error(error, where, src) from None
    if config.data.clean.model:
        try:
            _check_model(config.data.clean.model, "data.clean.model", src)
        except ValueError as error:
            raise ConfigError(f"{src}: {error}") from None


def _check_align(align, max_duration_s: float, where: str) -> None:
    """ValueError naming the key when an ``align`` setting is out of its range: ``max_seconds`` above 0 and
    at most ``data.max_duration_s`` (Features would reject what Align made), ``min_score`` at most 0 (a
    mean log-probability)."""
    if align.max_seconds <= 0 or (max_duration_s and align.max_seconds > max_duration_s):
        raise ValueError(
            f"{where}.max_seconds: expected a value above 0 and at most data.max_duration_s "
            f"({max_duration_s:g}), got {align.max_seconds:g}"
        )
    if align.min_score > 0:
        raise ValueError(
            f"{where}.min_score: expected a value at most 0 (a mean log-probability), got {align.min_score:g}"
        )


def _check_model(model: str, where: str, src: str) -> None:
    """ValueError naming ``where`` when a model key names nothing, or names the config itself (a model
    that is a config's export: that config must be another)."""
    if not model:
        raise ValueError(
            f"{where}: name the model (an export directory of this project, a DeepSpeech/Coqui .tflite, or "
            "a config whose export it is)"
        )
    path = Path(model).expanduser()
    if not path.is_absolute() and Path(src).is_file():
        path = Path(src).parent / path
    if path.suffix in (".yaml", ".yml") and Path(src).is_file() and path.resolve() == Path(src).resolve():
        raise ValueError(f"{where}: {model} is this config itself; name another config, or a model")


def load_config(path: str | Path, overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Load a YAML config (following ``extends:``), apply ``overrides``
    ({section: {key: value}}), validate."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: config file does not exist")
    merged = _layer(path)
    if overrides:
        _merge_into(merged, overrides, f"{path} (overrides)", Path.cwd())
    return _freeze(merged, str(path.resolve()))


def config_from_dict(raw: dict, source: str = "<dict>", base_dir: str | Path | None = None) -> Config:
    """Build a config from a mapping shaped like the YAML file (no ``extends:``)."""
    merged: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    _merge_into(merged, dict(raw), source, Path(base_dir) if base_dir else Path.cwd())
    return _freeze(merged, source)


def section_values(section) -> dict:
    """A config section's keys and values as the YAML file writes them (a front end's settings inline,
    a mapping of options as a mapping, entries of a list of mappings as mappings without the keys left
    unset, a ``rest`` mapping's keys inline, a model family's under ``model.<family>:``)."""
    out = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, SectionOverride):
            out[f.name] = value.to_dict()
        elif f.metadata.get("frontend"):
            out.update(dataclasses.asdict(value))
        elif f.metadata.get("family"):
            if dataclasses.is_dataclass(value):
                from pipeline.model import model_family

                out[model_family(section.architecture).name] = dataclasses.asdict(value)
        elif f.metadata.get("rest"):
            out.update({key: list(v) if isinstance(v, tuple) else v for key, v in value})
        elif f.metadata.get("mapping"):
            out[f.name] = dict(value)
        elif dataclasses.is_dataclass(value):
            out[f.name] = section_values(value)
        elif value and isinstance(value, tuple) and dataclasses.is_dataclass(value[0]):
            out[f.name] = [{k: v for k, v in section_values(item).items() if v is not None} for item in value]
        else:
            out[f.name] = value
    return out


def config_to_dict(config: Config) -> dict:
    """The resolved config as plain data (for saving beside outputs)."""

    def plain(value):
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {name: plain(section_values(getattr(config, name))) for name in SECTIONS}


def documented_keys() -> list[tuple[str, str, Any, str]]:
    """(section, key, default, doc) for every config key of the schema (a front end's own settings are
    documented by the front end: ``native_client.frontends``)."""
    rows = []
    types = section_types()
    for name in SECTIONS:
        for f in dataclasses.fields(types[name]):
            if "doc" in f.metadata:
                rows.append((name, f.name, f.default, f.metadata["doc"]))
    return rows
