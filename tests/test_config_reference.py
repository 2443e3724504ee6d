import dataclasses
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pipeline.config import Config
from pipeline.config_reference import render_reference, section_table
from tests.conftest import ROOT

REFERENCE = ROOT / "docs" / "CONFIGURATION.md"


def test_the_configuration_reference_is_up_to_date():
    rendered = render_reference()
    written = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
    assert written == rendered, (
        "docs/CONFIGURATION.md differs from what pipeline/config_reference.py renders from "
        "pipeline/config.py: run `make docs` and commit the result"
    )


def test_every_key_of_every_section_is_documented_and_listed():
    from native_client.frontends import frontend_class
    from native_client.plugins import builtin_names

    rendered = render_reference()
    sections = {
        name: tp for name, tp in typing.get_type_hints(Config).items() if dataclasses.is_dataclass(tp)
    }
    assert set(sections) >= {"paths", "data", "features", "model", "training", "decoder"}
    for name, section in sections.items():
        for key in dataclasses.fields(section):
            if key.metadata.get("frontend") or key.metadata.get("family"):  # their own keys: tables below
                continue
            assert key.metadata.get("doc"), f"{name}.{key.name} has no doc"
            assert f"| `{name}.{key.name}` |" in rendered, f"the reference lacks {name}.{key.name}"
    for frontend in builtin_names("native_client.frontends", "FRONTEND"):
        section = rendered.split(f"### `features.type: {frontend}`", 1)[1].split("##", 1)[0]
        for key in dataclasses.fields(frontend_class(frontend).Settings):
            assert key.metadata.get("doc") and f"| `features.{key.name}` |" in section, (frontend, key.name)
    from pipeline.model import model_family

    families = [model_family(name) for name in builtin_names("pipeline.model", "FAMILY")]
    assert any(family.Settings is not None for family in families)  # the conformer's
    for family in families:
        if family.Settings is None:
            continue
        section = rendered.split(f"### `model.architecture: {family.name}`", 1)[1].split("##", 1)[0]
        for key in dataclasses.fields(family.Settings):
            assert key.metadata.get("doc") and f"| `model.{family.name}.{key.name}` |" in section, key.name


def test_the_command_prints_the_reference():
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.config_reference"], capture_output=True, text=True, check=True
    )
    assert result.stdout == render_reference()


@dataclass(frozen=True)
class _FrontEndSettings:
    """Settings of a test front end."""

    nfilt: int = field(default=40, metadata={"doc": "Mel filters.", "min": 1, "max": 128})
    dither: float = field(
        default=0.0, metadata={"doc": "Dither |amplitude|.", "min": 0.0, "exclusive_min": True}
    )


@dataclass(frozen=True)
class _Section:
    """A test section."""

    STAGES: ClassVar[tuple[str, ...]] = ("features",)

    type: Literal["mfcc", "logfbank"] = field(
        default="mfcc", metadata={"doc": "Front end.", "stages": ("features:train", "train")}
    )
    files: tuple[str, ...] = field(default=(), metadata={"doc": "Files.", "path": True, "stages": None})
    workers: int = field(default=3, metadata={"doc": "Workers.", "stages": ()})
    hidden: int = 3  # not a key: no doc
    frontend: _FrontEndSettings = field(default=_FrontEndSettings(), metadata={"doc": "Front-end keys."})


@dataclass(frozen=True)
class _Config:
    section: _Section = _Section()
    source: str = "<defaults>"


def test_a_section_renders_types_ranges_stages_and_nested_settings():
    lines = section_table(_Section, "section.")
    table = "\n".join(lines)
    assert lines[0] == "| key | type | default | range | meaning | re-runs |"
    assert (
        "| `section.type` | one of `mfcc`, `logfbank` | `mfcc` |  | Front end. "
        "| FeaturesSplit(train), Train |" in table
    )
    assert "| `section.files` | list of path | `[]` |  | Files. | FeaturesSplit |" in table  # the section's
    assert "| `section.workers` | int | `3` |  | Workers. | nothing (changes no result) |" in table
    assert "section.hidden" not in table
    assert "`section.frontend`: Front-end keys." in table
    assert "| `section.frontend.nfilt` | int | `40` | [1, 128] | Mel filters. |" in table
    assert "| `section.frontend.dither` | float | `0.0` | > 0.0 | Dither \\|amplitude\\|. |" in table


def test_the_reference_covers_every_dataclass_section_and_no_other_field():
    rendered = render_reference(_Config)
    assert "## section\n\nA test section.\n" in rendered
    assert "source" not in rendered.split("## section", 1)[1]


def test_no_re_runs_column_for_settings_without_stages():
    @dataclass(frozen=True)
    class Plain:
        width: int = field(default=8, metadata={"doc": "Width <n> of it.", "max": 16})

    assert section_table(Plain, "plain.") == [
        "| key | type | default | range | meaning |",
        "|---|---|---|---|---|",
        "| `plain.width` | int | `8` | <= 16 | Width \\<n> of it. |",
    ]
