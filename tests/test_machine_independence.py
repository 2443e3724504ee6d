"""No fingerprint depends on the machine (issue 42, G3): which tools are on PATH (KenLM's lmplz,
build_binary and filter; espeak-ng) and their versions never move a stage's directory. The tool a
stage used is in its report instead, and ``decoder.lm_builder: kenlm`` where the tools are missing is
one line before anything runs.

The tests change the real PATH (a process's environment, or ``os.environ`` in this one) and leave the
lookups alone. KenLM's tools are also looked up beside the Python that runs (``make kenlm`` puts them in
``.venv/bin``), which no PATH hides: the in-process tests point ``sys.executable`` at an empty folder,
and the processes are started by a virtualenv of this one's packages with nothing else in its ``bin``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.config_loader import load_config
from pipeline.data.phonemes import espeak_version
from pipeline.layout import Layout
from pipeline.lm.kenlm_tools import TOOLS, find_tools
from pipeline.reports import LMReport, read_report
from pipeline.stages.gc import reached_nodes
from pipeline.stages.language_model import language_model_stage
from tests.conftest import ROOT, SAMPLE

PYTHON = sys.executable  # the interpreter itself, whatever a test points sys.executable at

# Stand-ins for KenLM's tools that really build an LM: lmplz estimates the model with the project's own
# Kneser-Ney estimator (which agrees with lmplz: tests/test_kenlm.py), build_binary copies the ARPA.
FAKE_LMPLZ = """#!{python}
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from pipeline.lm.kneser_ney import estimate, write_arpa
args = sys.argv[1:]
order, arpa = int(args[args.index("-o") + 1]), Path(args[args.index("--arpa") + 1])
write_arpa(estimate((line.split() for line in sys.stdin.read().splitlines() if line.strip()), order), arpa)
"""
FAKE_BUILD_BINARY = """#!{python}
import shutil, sys
shutil.copy(sys.argv[-2], sys.argv[-1])
"""
FAKE_FILTER = "#!/bin/sh\nexit 1\n"
FAKE_ESPEAK = '#!/bin/sh\necho "eSpeak NG text-to-speech: {version}  Data at: /nowhere"\n'


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Folders of stand-in tools and a ``use(*folders)`` that makes them this process's whole PATH (none:
    a PATH that finds nothing); KenLM's tools beside the interpreter are out of sight."""
    folders = {
        "kenlm": tmp_path / "bin-kenlm",
        "espeak-1": tmp_path / "bin-espeak-1",
        "espeak-2": tmp_path / "bin-espeak-2",
        "empty": tmp_path / "bin-empty",
    }
    _script(folders["kenlm"] / "lmplz", FAKE_LMPLZ.format(python=PYTHON, root=str(ROOT)))
    _script(folders["kenlm"] / "build_binary", FAKE_BUILD_BINARY.format(python=PYTHON))
    _script(folders["kenlm"] / "filter", FAKE_FILTER)
    _script(folders["espeak-1"] / "espeak-ng", FAKE_ESPEAK.format(version="1.49.2"))
    _script(folders["espeak-2"] / "espeak-ng", FAKE_ESPEAK.format(version="1.51"))
    folders["empty"].mkdir()
    monkeypatch.setattr(sys, "executable", str(folders["empty"] / "python"))

    def use(*names: str) -> None:
        monkeypatch.setenv("PATH", os.pathsep.join(str(folders[name]) for name in names or ("empty",)))

    return use


def _configs(tmp_path: Path) -> list[Path]:
    """A single-task config with each LM builder (auto, the default, with tuning), and multi-task configs
    with a phonemes task (its own alphabet, and one alphabet shared with its ``of`` task)."""
    work = tmp_path / "work"
    single = textwrap.dedent(f"""
        extends: {ROOT / "configs" / "sample.yaml"}
        paths: {{work_dir: {work}}}
        decoder: {{tune: true, lm_builder: BUILDER}}
    """)
    paths = []
    for builder in ("auto", "kenlm", "python"):
        paths.append(tmp_path / f"{builder}.yaml")
        paths[-1].write_text(single.replace("BUILDER", builder))
    for sharing in ("separate", "shared"):
        paths.append(tmp_path / f"phonemes-{sharing}.yaml")
        paths[-1].write_text(
            textwrap.dedent(f"""
            paths: {{work_dir: {work}, alphabet: auto}}
            multitask:
              sharing: {sharing}
              tasks:
                - name: en
                  data:
                    train_files: [{SAMPLE / "train.csv"}]
                    dev_files: [{SAMPLE / "dev.csv"}]
                    test_files: [{SAMPLE / "test.csv"}]
                    text: {{language: en-us}}
                - {{name: ph, weight: 0.3, targets: phonemes, of: en, export: false}}
            """)
        )
    return paths


def _fingerprints(paths: list[Path]) -> dict[str, str]:
    """Every stage instance's fingerprint of each config (a new layout each time: nothing remembered)."""
    found = {}
    for path in paths:
        config = load_config(path)
        layout = Layout(config)
        for name, params in reached_nodes(config):
            found[f"{path.name} {name}{sorted(params.items())}"] = layout.fingerprint(name, **params)
    return found


def test_no_fingerprint_depends_on_the_tools_on_path_or_their_versions(machine, tmp_path):
    paths = _configs(tmp_path)
    seen = {}
    for folders, tools, espeak in (
        ((), False, "none"),
        (("kenlm", "espeak-1"), True, "eSpeak NG text-to-speech: 1.49.2"),
        (("espeak-2",), False, "eSpeak NG text-to-speech: 1.51"),
    ):
        machine(*folders)
        assert (find_tools() is not None, espeak_version()) == (tools, espeak)  # the PATH is as meant
        seen[folders] = _fingerprints(paths)
    first = next(iter(seen.values()))
    assert any(key.endswith("phonemes[('task', 'ph')]") for key in first)
    assert any(key.startswith("auto.yaml lm") for key in first)
    for folders, fingerprints in seen.items():
        assert fingerprints == first, folders
    # An explicit builder is a setting: it has a fingerprint of its own; auto's is the same either way.
    lm = {name: first[f"{name}.yaml lm[]"] for name in ("auto", "kenlm", "python")}
    assert len(set(lm.values())) == 3, lm


def test_the_lm_report_says_which_builder_auto_used(machine, tmp_path, small_config):
    extra = "decoder:\n  lm_corpus_files: []\n  lm_order: 2\n"
    built = {}
    for folders, work in ((("kenlm",), "with-tools"), ((), "without")):
        machine(*folders)
        path = small_config(f"{work}.yaml", limit_train=8, extra=extra)
        path.write_text(path.read_text() + f"paths:\n  work_dir: {tmp_path / work}\n")
        layout = Layout(load_config(path))
        report = language_model_stage(layout)
        assert read_report(layout.lm.report, LMReport) == report
        built[report.builder] = layout.lm.root
    assert set(built) == {"kenlm", "python"}
    assert built["kenlm"].name == built["python"].name  # one fingerprint, whichever builder auto found
    assert (built["kenlm"] / "lm.binary").is_file() and (built["python"] / "lm.arpa").is_file()


@pytest.fixture
def bare_python(tmp_path) -> str:
    """A Python with this one's packages and no KenLM tools beside it (``make kenlm`` puts them beside
    the virtualenv's interpreter, where no PATH hides them): a virtualenv of its own whose ``lib`` is
    this one's."""
    here = Path(PYTHON).parent
    if not any((here / name).exists() for name in TOOLS):
        return PYTHON
    prefix = Path(sys.prefix)
    if not (prefix / "pyvenv.cfg").is_file():
        pytest.skip("KenLM's tools are beside this Python, which is not a virtualenv to copy")
    venv = tmp_path / "bare-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text((prefix / "pyvenv.cfg").read_text())
    (venv / "lib").symlink_to(prefix / "lib")
    (venv / "bin" / "python").symlink_to(os.path.realpath(PYTHON))
    return str(venv / "bin" / "python")


def _run(python: str, args: list[str], path: str) -> subprocess.CompletedProcess:
    """``deepspeech-train ARGS`` run by ``python`` in a process whose PATH is ``path``."""
    result = subprocess.run(
        [python, "-c", "import sys; from pipeline.lm.kenlm_tools import find_tools; print(find_tools())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path},
    )
    assert result.stdout.strip() == "None", result  # the process finds no KenLM tool
    return subprocess.run(
        [python, "-m", "tasks.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": path},
    )


def test_lm_builder_kenlm_without_the_tools_is_one_line_before_anything_runs(
    bare_python, small_config, tmp_path
):
    path = small_config(extra="decoder:\n  lm_builder: kenlm\n")
    result = _run(
        bare_python, ["LanguageModel", "--config", str(path), "--local-scheduler"], str(tmp_path / "nothing")
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "decoder.lm_builder is kenlm but KenLM's lmplz, build_binary and filter are not installed" in (
        result.stderr
    )
    assert "make kenlm" in result.stderr and str(path) in result.stderr
    assert not (tmp_path / "work").exists()


def test_gc_from_a_shell_without_the_tools_keeps_the_lm_built_with_them(
    bare_python, machine, small_config, tmp_path
):
    extra = "decoder:\n  lm_corpus_files: []\n  lm_order: 2\n"
    path = small_config(limit_train=8, extra=extra)
    machine("kenlm")
    layout = Layout(load_config(path))
    assert language_model_stage(layout).builder == "kenlm"
    lm = layout.lm.root
    # a stale LM of another setting, which gc does list: the dry run below is not empty for want of looking
    other = small_config("other.yaml", limit_train=8, extra=extra.replace("lm_order: 2", "lm_order: 3"))
    stale = Layout(load_config(other)).lm.root
    stale.mkdir(parents=True)
    (stale / "lm.arpa").write_text("stale")

    dry = _run(bare_python, ["gc", "--config", str(path), "--dry-run"], str(tmp_path / "nothing"))
    assert dry.returncode == 0, dry.stderr
    listed = [line for line in dry.stdout.splitlines() if line.startswith("would remove")]
    assert [line.split(" ")[2] for line in listed] == [str(stale)], dry.stdout
    assert str(lm) not in dry.stdout and lm.is_dir()
    assert json.loads((lm / "lm_report.json").read_text())["builder"] == "kenlm"
