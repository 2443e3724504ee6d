"""The command lines of a multi-task config (issue 34): ``--task`` checked before anything runs (one line
naming it, exit 2), a stage named without ``--task`` run for every task (``make train`` as for one task),
``make rerun`` with an unknown task refused instead of removing nothing and running the DAG, and a
phonemes task whose language espeak-ng does not speak refused before any stage starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.config_loader import load_config
from pipeline.layout import Layout
from tasks.preflight import PreflightError, check_inputs, stage_tasks
from tests.conftest import ROOT
from tests.test_multitask_dag import _config

PHONEMES = "    - {name: en_phones, targets: phonemes, of: en, weight: 0.3, export: false}\n"


def _command(module: str, *args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize(
    "name, given, says",
    [
        (
            "Evaluate",
            {"task": "de"},
            r"--task de: multitask\.tasks has no task 'de'; its tasks: en, fr, en_phones",
        ),
        ("Export", {"task": "en_phones"}, r"--task en_phones: the task has export: false"),
        (
            "Transcribe",
            {"task": "en_phones", "audio": "clip.wav"},
            r"--task en_phones: the task has export: false",
        ),
        ("Phonemes", {"task": "fr"}, r"--task fr: the task has no targets: phonemes"),
        ("TuneDecoder", {"task": "fr"}, r"--task fr: the task's decoder\.tune is off"),
        ("Features", {"task": "de"}, r"--task de: multitask\.tasks has no task 'de'"),
        ("Train", {"task": "fr"}, r"--task fr: Train is one stage over every task; give no --task"),
    ],
)
def test_a_task_the_pipeline_has_no_such_stage_of_is_one_line_naming_task(tmp_path, name, given, says):
    path, _, _ = _config(tmp_path, extra_task=PHONEMES)
    with pytest.raises(PreflightError, match=says) as error:
        stage_tasks(load_config(path), name, given)
    assert "\n" not in str(error.value) and path.name in str(error.value)


def test_a_stage_without_task_runs_every_task_and_a_single_task_config_takes_none(tmp_path, write_config):
    path, _, _ = _config(tmp_path, extra_task=PHONEMES)
    config = load_config(path)
    assert stage_tasks(config, "Evaluate", {}) == ["en", "fr", "en_phones"]
    assert stage_tasks(config, "Transcribe", {"audio": "clip.wav"}) == ["en", "fr"]  # en_phones: not exported
    assert stage_tasks(config, "Phonemes", {}) == ["en_phones"]
    assert stage_tasks(config, "Evaluate", {"task": "fr"}) == ["fr"]
    assert stage_tasks(config, "Features", {}) == [""]  # the group runs every task's itself
    assert stage_tasks(config, "Train", {}) == [""]
    single = load_config(write_config(f"paths: {{work_dir: {tmp_path / 'w'}}}\n", name="single.yaml"))
    assert stage_tasks(single, "Evaluate", {}) == [""]
    with pytest.raises(PreflightError, match=r"single\.yaml: --task fr: this config has no multitask\.tasks"):
        stage_tasks(single, "Evaluate", {"task": "fr"})


def test_a_task_without_test_split_is_refused_for_evaluate_naming_its_entry(tmp_path):
    path, _, fr = _config(tmp_path)
    path.write_text(path.read_text().replace(f"test_files: [{fr['test']}]", "test_files: []"))
    config = load_config(path)
    for given in ({}, {"task": "fr"}):
        with pytest.raises(
            PreflightError, match=r"multitask\.tasks\[1\] \(fr\): data\.test_files: Evaluate scores the test"
        ):
            stage_tasks(config, "Evaluate", given)
    assert stage_tasks(config, "Evaluate", {"task": "en"}) == ["en"]


def test_a_phonemes_task_in_a_language_espeak_ng_lacks_is_refused_before_any_stage(tmp_path):
    path, en, _ = _config(tmp_path, extra_task=PHONEMES)
    given = f"data: {{train_files: [{en['train']}]"
    path.write_text(
        path.read_text().replace(given, f"data: {{text: {{language: zz}}, train_files: [{en['train']}]")
    )
    config = load_config(path)
    assert config.task_view("en").data.text.language == "zz"
    with pytest.raises(
        PreflightError, match=r"multitask\.tasks\[2\] \(en_phones\): espeak-ng has no voice 'zz'"
    ):
        check_inputs(config)


def test_the_command_line_runs_a_stage_of_every_task_and_refuses_an_unknown_task(tmp_path):
    path, _, _ = _config(tmp_path)
    bad = _command(
        "tasks.cli", "Alphabet", "--task", "de", "--config", str(path), "--local-scheduler", cwd=tmp_path
    )
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert bad.stderr.strip().splitlines() == [
        f"error: {path}: --task de: multitask.tasks has no task 'de'; its tasks: en, fr"
    ]
    assert not (tmp_path / "work").exists()
    # --task given in either form, for a stage of one task: that one only
    one = _command(
        "tasks.cli", "Alphabet", "--task=fr", "--config", str(path), "--local-scheduler", cwd=tmp_path
    )
    assert one.returncode == 0, one.stderr[-3000:]
    layout = Layout(load_config(path))
    assert layout.for_task("fr").alphabet.is_file() and not layout.for_task("en").alphabet.exists()
    ran = _command("tasks.cli", "Alphabet", "--config", str(path), "--local-scheduler", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "note: a multi-task config: Alphabet of each task: --task en, fr" in ran.stderr
    for task in ("en", "fr"):
        assert layout.for_task(task).alphabet.is_file()
    # make rerun STAGE=Evaluate TASK=de: refused, nothing removed, nothing run
    rerun = _command(
        "tasks.rerun", "Alphabet", "--task", "de", "--config", str(path), "--local-scheduler", cwd=tmp_path
    )
    assert rerun.returncode == 2, rerun.stderr[-2000:]
    assert "--task de: multitask.tasks has no task 'de'" in rerun.stderr
    for task in ("en", "fr"):
        assert layout.for_task(task).alphabet.is_file()


def test_the_shared_alphabet_is_one_stage_without_task(tmp_path):
    """With ``sharing: shared`` one Alphabet, without a task, builds every task's: the command line runs it
    as it is, and ``--task`` is refused naming why; ``make rerun STAGE=Alphabet`` finds it to remove."""
    path, _, _ = _config(tmp_path, sharing="shared")
    config = load_config(path)
    assert stage_tasks(config, "Alphabet", {}) == [""]
    with pytest.raises(PreflightError, match=r"--task fr: with multitask\.sharing: shared one Alphabet"):
        stage_tasks(config, "Alphabet", {"task": "fr"})
    ran = _command("tasks.cli", "Alphabet", "--config", str(path), "--local-scheduler", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    alphabet = Layout(config).for_task("fr").alphabet
    assert alphabet == Layout(config).for_task("en").alphabet and alphabet.is_file()
    rerun = _command("tasks.rerun", "Alphabet", "--config", str(path), "--dry-run", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"would remove {alphabet.parent}" in rerun.stdout, rerun.stdout


def test_make_rerun_passes_task_on():
    """``make rerun STAGE=Evaluate TASK=fr`` re-runs fr's Evaluate only (make -n: the command it runs)."""
    planned = subprocess.run(
        ["make", "-n", "rerun", "STAGE=Evaluate", "TASK=fr", "CONFIG=multi.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert planned.returncode == 0, planned.stderr
    # make -n also lists setup's commands when the venv's stamp is older than pyproject.toml (a fresh clone)
    (command,) = [line.split() for line in planned.stdout.splitlines() if "tasks.rerun" in line]
    assert command[command.index("tasks.rerun") + 1 :][:1] == ["Evaluate"]
    assert command[command.index("--task") + 1] == "fr"
    every = subprocess.run(
        ["make", "-n", "rerun", "STAGE=Evaluate", "CONFIG=multi.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    (line,) = [line for line in every.stdout.splitlines() if "tasks.rerun" in line]
    assert "--task" not in line


def test_a_task_that_takes_some_of_its_files_from_the_top_level_is_noted():
    """A task giving only train_files is validated and tested on the top level's dev and test files
    (perhaps another language's): the command line says so; a task giving all of them, a task giving
    none (all the top level's) and a phonemes task are not noted."""
    from pipeline.config_loader import config_from_dict
    from tasks.preflight import inherited_splits

    data = {"train_files": ["en/train.csv"], "dev_files": ["en/dev.csv"], "test_files": ["en/test.csv"]}
    tasks = [
        {"name": "en"},
        {"name": "fr", "data": {"train_files": ["fr/train.csv"]}},
        {"name": "de", "data": {**{k: [f"de/{k}.csv"] for k in data}}},
        {"name": "en_phones", "targets": "phonemes", "of": "en", "export": False, "weight": 0.3},
    ]
    config = config_from_dict({"data": data, "multitask": {"tasks": tasks}})
    notes = inherited_splits(config)
    assert len(notes) == 1, notes
    assert (
        "multitask.tasks[1] (fr): gives data.train_files but takes data.dev_files, data.test_files"
        in notes[0]
    )
    fixed = [{"name": "fr", "data": {"train_files": ["fr/train.csv"], "dev_files": [], "test_files": []}}]
    assert inherited_splits(config_from_dict({"data": data, "multitask": {"tasks": tasks[:1] + fixed}})) == []
