"""A config value read from YAML against its schema field: coerced to the field's type (a choice as YAML
spells it, a path resolved from the file that wrote it, an entry of a list of mappings, a task's section
override) and checked against its range; every error one line naming where the value was written.
``pipeline.config_loader`` reads the files and calls ``checked`` for each key."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pipeline.config import Config, ConfigError, SectionOverride

# The config's sections; ``source`` (its file) and ``task`` (a task view's name) are not keys of the file.
SECTIONS = {f.name: f.type for f in dataclasses.fields(Config) if f.name not in ("source", "task")}


def section_types() -> dict[str, type]:
    """The type of each section of a config file."""
    hints = typing.get_type_hints(Config)
    return {name: hints[name] for name in SECTIONS}


def _describe(tp) -> str:
    if dataclasses.is_dataclass(tp):
        return "a mapping of keys"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(_choice(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _describe(inner[0]) + " or null"
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(item):
            return "a list of mappings"
        return "a list of " + {str: "strings", int: "integers", float: "numbers"}[item]
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[tp]


def _choice(value) -> str:
    """A choice as YAML writes it: ``true``, ``'global'``."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


# The words YAML 1.1 (PyYAML) reads as booleans, by the boolean they become.
YAML_BOOLEAN_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def _spelled_choice(value: Any, choices: tuple) -> Any:
    """The choice among ``choices`` a YAML boolean was written as: ``rule: off`` reaches the loader as
    False (YAML 1.1 reads off/no/on/yes as booleans), which means the choice ``"off"`` when that is one.
    Any other value is returned as it is."""
    if not isinstance(value, bool):
        return value
    spelled = [
        choice
        for choice in choices
        if isinstance(choice, str) and choice.lower() in YAML_BOOLEAN_WORDS[value]
    ]
    return spelled[0] if len(spelled) == 1 else value


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
        value = _spelled_choice(value, typing.get_args(tp))
        # By type too: 0 and 1 equal False and True but are not the choices false and true.
        if not any(value == choice and type(value) is type(choice) for choice in typing.get_args(tp)):
            raise bad
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return _entry(value, tp, where, base_dir)
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if isinstance(value, str) and not dataclasses.is_dataclass(item):
            value = [value]
        if not isinstance(value, list):
            raise bad
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


def _entry(value: dict, cls: type, where: str, base_dir: Path | None):
    """A mapping checked key by key into the dataclass ``cls`` (an entry of a list of mappings, or a nested
    group of keys): documented fields by their type and range, the other keys into the field marked
    ``rest`` (or an error naming the key), and a one-line error for a ``required`` key left out."""
    known = {f.name: f for f in dataclasses.fields(cls) if "doc" in f.metadata}
    hints = typing.get_type_hints(cls)
    rest = next((f.name for f in known.values() if f.metadata.get("rest")), None)
    values, extra = {}, {}
    for key, item in value.items():
        at = f"{where}.{key}"
        if key in known and known[key].metadata.get("override"):
            values[key] = _override(item, known[key].metadata, at, base_dir)
        elif key in known:
            values[key] = checked(item, hints[key], known[key].metadata, at, base_dir)
        elif rest is not None and isinstance(key, str):
            extra[key] = item
        else:
            raise ConfigError(
                f"{at}: unknown key; {did_you_mean(key, known)}expected one of {', '.join(known)}"
            )
    if extra:
        for dotted in getattr(cls, "OPTION_PATHS", ()):
            extra = _resolve_option_path(extra, dotted.split("."), base_dir)
        values[rest] = tuple(sorted({**dict(values.get(rest, ())), **dict(_mapping(extra, where))}.items()))
    for name, f in known.items():
        if f.metadata.get("required") and values.get(name) in (None, ""):
            raise ConfigError(f"{where}.{name}: required, not given")
    return cls(**values)


def _resolve_option_path(options: dict, keys: list[str], base_dir: Path | None) -> dict:
    """``options`` with the path at ``keys`` (``["align", "model"]``) resolved against ``base_dir``, the
    folder of the file that wrote it, as every path key is (a copy; the rest as it was)."""
    head, *tail = keys
    value = options.get(head)
    if tail:
        return (
            {**options, head: _resolve_option_path(value, tail, base_dir)}
            if isinstance(value, dict)
            else options
        )
    if not isinstance(value, str) or not value or base_dir is None:
        return options
    path = Path(value).expanduser()
    return {**options, head: str(path if path.is_absolute() else (base_dir / path).resolve())}


def _override(value, meta: dict, where: str, base_dir: Path | None) -> SectionOverride:
    """A task's keys of one section (``meta["override"]``), each checked as that section's key (its type,
    range, paths resolved from the file that wrote it); only ``meta["override_keys"]`` when given."""
    section = meta["override"]
    return _section_override(value, section_types()[section], where, base_dir, meta["override_keys"])


def _section_override(
    value, cls: type, where: str, base_dir: Path | None, allowed: tuple = ()
) -> SectionOverride:
    if value is None:
        return SectionOverride()
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of keys, got {value!r}")
    known = {
        f.name: f
        for f in dataclasses.fields(cls)
        if "doc" in f.metadata and (not allowed or f.name in allowed)
    }
    hints = typing.get_type_hints(cls)
    values = []
    for key, item in value.items():
        at = f"{where}.{key}"
        if key not in known:
            raise ConfigError(
                f"{at}: unknown key; {did_you_mean(key, known)}expected one of {', '.join(known)}"
            )
        if dataclasses.is_dataclass(hints[key]) and isinstance(item, dict):
            values.append((key, _section_override(item, hints[key], at, base_dir)))
        else:
            values.append((key, checked(item, hints[key], known[key].metadata, at, base_dir)))
    return SectionOverride(tuple(values))


def _check_range(value, meta: dict, where: str) -> None:
    if value is None or isinstance(value, (str, bool, tuple)) or dataclasses.is_dataclass(value):
        return
    low, high = meta.get("min"), meta.get("max")
    if low is not None and (value < low or (meta.get("exclusive_min") and value == low)):
        relation = "greater than" if meta.get("exclusive_min") else "at least"
        raise ConfigError(f"{where}: expected a value {relation} {low}, got {value!r}")
    if high is not None and value > high:
        raise ConfigError(f"{where}: expected a value at most {high}, got {value!r}")


def did_you_mean(key, known) -> str:
    """``did you mean 'x'? `` for the known name closest to ``key``, or nothing."""
    close = difflib.get_close_matches(str(key), list(known), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def checked(value, tp, meta: dict, where: str, base_dir: Path | None):
    """``value`` coerced to ``tp`` and checked against the field's range."""
    if meta.get("mapping"):  # a plug-in's own settings, kept as sorted (key, value) pairs
        return _mapping(value, where)
    if value in meta.get("keywords", ()):  # a word the key takes besides a path (paths.alphabet: auto)
        return value
    checked = _coerce(value, tp, where, base_dir, meta.get("path", False))
    _check_range(checked, meta, where)
    return checked


def _mapping(value, where: str) -> tuple:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of settings, got {value!r}")
    if any(not isinstance(key, str) for key in value):
        raise ConfigError(f"{where}: expected names as keys, got {sorted(map(repr, value))}")

    def frozen(item, at):
        if isinstance(item, list):
            return tuple(frozen(v, f"{at}[{i}]") for i, v in enumerate(item))
        if isinstance(item, dict):  # a nested mapping (an importer's ``align:``), as sorted pairs too
            return _mapping(item, at)
        if item is None or isinstance(item, (str, bool, int, float)):
            return item
        raise ConfigError(f"{at}: expected a number, string, boolean, list or mapping, got {item!r}")

    return tuple(sorted((str(k), frozen(v, f"{where}.{k}")) for k, v in value.items()))
