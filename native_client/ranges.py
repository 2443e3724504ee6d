"""The types and ranges of settings that the config, an export's ``metadata.json`` and the client's options
share, and the check of a value against them.

The pipeline's config schema takes its ranges of these settings from here (``pipeline`` may import
``native_client``, never the reverse), so that the client refuses what the config refuses: a beam width of
0 or ``--lm_alpha nan`` from the command line, or ``decoder.beam_width: "wide"`` from an edited export. A
front end's settings carry their ranges in their dataclass fields (``native_client.frontends._base.setting``);
``check_fields`` checks values read from a file against those.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """A setting's type (``int``, ``float``, ``bool`` or ``str``) and bounds (None: unbounded); numbers
    must be finite."""

    type: type
    minimum: float | None = None
    maximum: float | None = None
    exclusive_min: bool = False


# The decoder settings an export records and the client's options override (``decoder.*`` in the config).
DECODER_SETTINGS = {
    "beam_width": Range(int, 1),
    "beam_threshold": Range(float, 0.0),
    "beam_size_token": Range(int, 0),
    "lm_alpha": Range(float),
    "lm_beta": Range(float),
    "lexicon": Range(bool),
}
# ``features.sample_rate``: the lowest rate that carries speech, the highest audio interfaces record.
SAMPLE_RATE = Range(int, 1000, 384_000)

_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def value_problem(value, expected: Range) -> str | None:
    """What is wrong with ``value`` as a setting of range ``expected`` (``expected an integer of at least
    1, got 0``), or None when it fits."""
    kind = expected.type
    fits = (
        isinstance(value, bool)
        if kind is bool
        else isinstance(value, str)
        if kind is str
        else not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
    )
    low, high = expected.minimum, expected.maximum
    bounds = ""
    if low is not None:
        bounds += f" {'greater than' if expected.exclusive_min else 'of at least'} {low:g}"
    if high is not None:
        bounds += f"{' and' if low is not None else ''} at most {high:g}"
    wanted = f"expected {'a finite number' if kind is float else _NAMES[kind]}{bounds}"
    if not fits:
        return f"{wanted}, got {value!r}"
    if kind in (bool, str):
        return None
    if not math.isfinite(value):
        return f"{wanted}, got {value!r}"
    if low is not None and (value < low or (expected.exclusive_min and value == low)):
        return f"{wanted}, got {value!r}"
    if high is not None and value > high:
        return f"{wanted}, got {value!r}"
    return None


def check_decoder_settings(values: Mapping, where: str = "decoder") -> None:
    """ValueError ``<where>.<key>: expected ...`` for the first ``DECODER_SETTINGS`` key of ``values`` that
    is of the wrong type or out of range (other keys are a decoder's own: not checked here)."""
    for key, expected in DECODER_SETTINGS.items():
        if key in values and (problem := value_problem(values[key], expected)):
            raise ValueError(f"{where}.{key}: {problem}")


def check_fields(cls: type, values: Mapping, where: str) -> None:
    """ValueError ``<where>.<key>: expected ...`` for the first value whose field of the dataclass ``cls``
    is of another type (int, float, bool, str) or whose range (field metadata ``min``, ``max``,
    ``exclusive_min``) it leaves; keys that are not fields are left to the caller."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # a plug-in's annotations that do not resolve: its types are its own
        hints = {}
    for field in dataclasses.fields(cls):
        if field.name not in values or hints.get(field.name) not in _NAMES:
            continue
        meta = field.metadata
        expected = Range(hints[field.name], meta.get("min"), meta.get("max"), bool(meta.get("exclusive_min")))
        if problem := value_problem(values[field.name], expected):
            raise ValueError(f"{where}.{field.name}: {problem}" if where else f"{field.name}: {problem}")
