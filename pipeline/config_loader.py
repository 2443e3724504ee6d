"""Reading configs: YAML files (with ``extends:``) and overrides -> a validated, frozen ``Config``.

Layering: dataclass defaults <- the ``extends:`` chain of YAML files (each
overriding a subset) <- explicit overrides -> validate -> freeze. Paths in a
file are relative to that file. Every error is one line naming the file, the
key and what was expected. The schema itself is ``pipeline.config``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.config import Config, ConfigError, validate_config

SECTIONS = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "source"}


def _section_types() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {name: hints[name] for name in SECTIONS}


def _describe(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _describe(inner[0]) + " or null"
    if origin is tuple:
        return "a list of " + {str: "strings", int: "integers", float: "numbers"}[typing.get_args(tp)[0]]
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[tp]


def _coerce(value: Any, tp, where: str, base_dir: Path | None, is_path: bool):
    """Check ``value`` against type ``tp``; resolve relative paths against ``base_dir``."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{where}: expected {_describe(tp)}, got {value!r}")
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return _coerce(value, inner, where, base_dir, is_path)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise bad
        item = typing.get_args(tp)[0]
        return tuple(_coerce(v, item, f"{where}[{i}]", base_dir, is_path) for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        if is_path and base_dir is not None:
            path = Path(value).expanduser()
            return str(path if path.is_absolute() else (base_dir / path).resolve())
        return value
    raise TypeError(f"unsupported config type {tp}")


def _check_range(value, meta: dict, where: str) -> None:
    if value is None or isinstance(value, (str, bool, tuple)):
        return
    low, high = meta["min"], meta["max"]
    if low is not None and (value < low or (meta["exclusive_min"] and value == low)):
        relation = "greater than" if meta["exclusive_min"] else "at least"
        raise ConfigError(f"{where}: expected a value {relation} {low}, got {value!r}")
    if high is not None and value > high:
        raise ConfigError(f"{where}: expected a value at most {high}, got {value!r}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys (YAML would silently keep the last one)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
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
        merged = _layer(parent_path, chain + (path,))
    _merge_into(merged, raw, str(path), path.parent)
    return merged


def _merge_into(merged: dict, raw: dict, source: str, base_dir: Path | None) -> None:
    types = _section_types()
    for section, values in raw.items():
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown section {section!r}; expected one of {', '.join(SECTIONS)}")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: {section}: expected a mapping of keys")
        known = {f.name: f for f in dataclasses.fields(types[section])}
        hints = typing.get_type_hints(types[section])
        for key, value in values.items():
            where = f"{source}: {section}.{key}"
            if key not in known:
                raise ConfigError(f"{where}: unknown key; expected one of {', '.join(known)}")
            meta = known[key].metadata
            checked = _coerce(value, hints[key], where, base_dir, meta["path"])
            _check_range(checked, meta, where)
            merged[section][key] = checked


def _freeze(merged: dict, source: str) -> Config:
    types = _section_types()
    sections = {}
    for name, values in merged.items():
        sections[name] = types[name](**values)
    config = Config(**sections, source=source)
    validate_config(config)
    return config


def load_config(path: str | Path, overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Load a YAML config (following ``extends:``), apply ``overrides`` ({section: {key: value}}), validate."""
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


def config_to_dict(config: Config) -> dict:
    """The resolved config as plain data (for saving beside outputs)."""
    out = {}
    for name in SECTIONS:
        section = dataclasses.asdict(getattr(config, name))
        out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in section.items()}
    return out


def documented_keys() -> list[tuple[str, str, Any, str]]:
    """(section, key, default, doc) for every config key, for the README reference."""
    rows = []
    types = _section_types()
    for name in SECTIONS:
        for f in dataclasses.fields(types[name]):
            rows.append((name, f.name, f.default, f.metadata["doc"]))
    return rows
