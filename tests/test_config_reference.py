import dataclasses
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from typing import Literal

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
    rendered = render_reference()
    sections = {
        name: tp for name, tp in typing.get_type_hints(Config).items() if dataclasses.is_dataclass(tp)
    }
    assert set(sections) >= {"paths", "data", "features", "model", "training", "decoder"}
    for name, section in sections.items():
        for key in dataclasses.fields(section):
            assert key.metadata.get("doc"), f"{name}.{key.name} has no doc"
            assert f"| `{name}.{key.name}` |" in rendered, f"the reference lacks {name}.{key.name}"


def test_the_command_prints_the_reference():
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.config_reference"], capture_output=True, text=True, check=True
    )
    assert result.stdout == render_reference()


@dataclass(frozen=True)
class _FrontEndSettings:
    """Settings of a test front end."""

    nfilt: int = field(
        default=40, metadata={"doc": "Mel filters.", "min": 1, "max": 128, "stage": "Features"}
    )
    dither: float = field(
        default=0.0, metadata={"doc": "Dither |amplitude|.", "min": 0.0, "exclusive_min": True}
    )


@dataclass(frozen=True)
class _Section:
    """A test section."""

    type: Literal["mfcc", "logfbank"] = field(
        default="mfcc", metadata={"doc": "Front end.", "stage": ("Features", "Train")}
    )
    files: tuple[str, ...] = field(default=(), metadata={"doc": "Files.", "path": True})
    plain: int = 3
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
        "| `section.type` | one of `mfcc`, `logfbank` | `mfcc` |  | Front end. | Features, Train |" in table
    )
    assert "| `section.files` | list of path | `[]` |  | Files. |  |" in table
    assert "| `section.plain` | int | `3` |  |  |  |" in table  # a field without metadata still appears
    assert "`section.frontend`: Front-end keys." in table
    assert "| `section.frontend.nfilt` | int | `40` | [1, 128] | Mel filters. | Features |" in table
    assert "| `section.frontend.dither` | float | `0.0` | > 0.0 | Dither \\|amplitude\\|. |" in table


def test_the_reference_covers_every_dataclass_section_and_no_other_field():
    rendered = render_reference(_Config)
    assert "## section\n\nA test section.\n" in rendered
    assert "source" not in rendered.split("## section", 1)[1]


def test_no_re_runs_column_without_stage_metadata():
    @dataclass(frozen=True)
    class Plain:
        width: int = field(default=8, metadata={"doc": "Width <n> of it.", "max": 16, "stage": None})

    assert section_table(Plain, "plain.") == [
        "| key | type | default | range | meaning |",
        "|---|---|---|---|---|",
        "| `plain.width` | int | `8` | <= 16 | Width \\<n> of it. |",
    ]
