"""The Luigi tasks, run for real with a local scheduler."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import luigi
import pytest
import yaml

from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.reports import TrainReport, read_report
from tasks import Evaluate, Features, FeaturesSplit, Train
from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("tasks_in_process")


def test_features_task_is_not_recomputed_and_moves_with_numcep(small_config):
    path = small_config(limit_train=6, limit_dev=3, limit_test=3)
    assert luigi.build([Features(config=str(path))], local_scheduler=True)
    config = load_config(path)
    cache = Layout(config).features_cache("train")
    stamp = cache.stat().st_mtime_ns
    assert FeaturesSplit(config=str(path), split="train").complete()
    assert luigi.build([Features(config=str(path))], local_scheduler=True)
    assert cache.stat().st_mtime_ns == stamp

    changed = small_config(
        "numcep.yaml",
        limit_train=6,
        limit_dev=3,
        limit_test=3,
        extra="features:\n  numcep: 13\n",
    )
    assert not FeaturesSplit(config=str(changed), split="train").complete()
    assert luigi.build([FeaturesSplit(config=str(changed), split="train")], local_scheduler=True)
    assert Layout(load_config(changed)).features_cache("train") != cache
    assert cache.stat().st_mtime_ns == stamp


def test_evaluate_runs_the_dag_and_train_is_complete_only_with_its_report(small_config):
    path = small_config(limit_train=8, limit_dev=4, limit_test=4, extra="training:\n  epochs: 1\n")
    assert luigi.build([Evaluate(config=str(path))], local_scheduler=True)
    config = load_config(path)
    evaluation = json.loads((Layout(config).evaluate_dir / "evaluation.json").read_text())
    assert {"wer", "cer", "loss", "samples"} <= set(evaluation)
    report = Layout(config).train_run.root / "train_report.json"
    assert Train(config=str(path)).complete()
    more = small_config(
        "more.yaml", limit_train=8, limit_dev=4, limit_test=4, extra="training:\n  epochs: 2\n"
    )
    assert Layout(load_config(more)).train_run.root == Layout(config).train_run.root
    assert not Train(config=str(more)).complete()
    report.unlink()
    assert not Train(config=str(path)).complete()


def test_n_more_epochs_after_a_finished_run_train_once(small_config):
    """Issue 26 M1: ``training.epochs: -2`` after a finished ``epochs: 1`` run trained nothing (Train was
    complete); it now trains two more, and the same command again trains no more."""
    from pipeline.stages.train import train_stage

    extra = "training:\n  epochs: {}\n  validation_epochs: 0\n"
    first = small_config(limit_train=8, limit_dev=4, limit_test=4, extra=extra.format(1))
    assert luigi.build([Train(config=str(first))], local_scheduler=True)
    more = small_config("more.yaml", limit_train=8, limit_dev=4, limit_test=4, extra=extra.format(-2))
    layout = Layout(load_config(more))
    assert layout.train_run.root == Layout(load_config(first)).train_run.root
    assert not Train(config=str(more)).complete()
    assert luigi.build([Train(config=str(more))], local_scheduler=True)
    report = read_report(layout.train_run.report, TrainReport)
    assert (report.epochs_completed, report.target_epochs, report.global_step) == (3, 3, 6)
    assert report.epochs_setting == -2
    stamp = layout.train_run.report.stat().st_mtime_ns
    assert Train(config=str(more)).complete()
    assert luigi.build([Train(config=str(more))], local_scheduler=True)
    assert layout.train_run.report.stat().st_mtime_ns == stamp
    assert train_stage(layout).global_step == 6  # the trainer itself agrees: nothing more to do
    assert Train(config=str(first)).complete()  # 3 epochs cover "epochs: 1"


def test_train_runs_without_a_dev_split(small_config, caplog):
    """Issue 26 M2: with ``data.dev_files: []`` (the default) Train failed ("split 'dev' has no rows"); it
    now trains without validation, warns that early stopping is off, and the last checkpoint is the best."""
    path = small_config(
        limit_train=8,
        limit_test=4,
        extra="data:\n  dev_files: []\ntraining:\n  epochs: 2\nearly_stop:\n  rule: patience\n",
    )
    with caplog.at_level(logging.WARNING):
        assert luigi.build([Train(config=str(path))], local_scheduler=True)
    layout = Layout(load_config(path))
    report = read_report(layout.train_run.report, TrainReport)
    assert report.epochs_completed == 2 and report.validations == [] and report.best_dev is None
    assert report.best_checkpoint.endswith(f"best-{report.global_step}")
    assert not layout.features_cache("dev").exists()
    messages = [r.getMessage() for r in caplog.records]
    assert any("data.dev_files is empty: training without validation" in m for m in messages), messages
    assert any("early_stop.rule is 'patience' but data.dev_files is empty" in m for m in messages)


def test_luigi_command_line_exits_non_zero_on_a_failed_task(write_config, tmp_path):
    manifest = tmp_path / "broken.csv"
    manifest.write_text("wav_filename,transcript\nx.wav,hello\n")
    path = write_config(f"""
        paths:
          work_dir: {tmp_path / "work"}
        data:
          train_files: [{manifest}]
    """)
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "luigi"),
            "--module",
            "tasks",
            "FeaturesSplit",
            "--split",
            "train",
            "--config",
            str(path),
            "--local-scheduler",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 30, result.stdout[-2000:] + result.stderr[-2000:]
    assert "header lacks column(s) wav_filesize" in result.stderr


@pytest.mark.slow
def test_two_pipelines_at_once_share_features_and_keep_their_own_training(small_config):
    first = small_config("a.yaml", limit_train=8, limit_dev=4, limit_test=4, extra="training:\n  epochs: 1\n")
    second = small_config(
        "b.yaml",
        limit_train=8,
        limit_dev=4,
        limit_test=4,
        extra="training:\n  epochs: 1\nmodel:\n  n_hidden: 24\n",
    )
    runs = [
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "luigi"),
                "--module",
                "tasks",
                "Train",
                "--config",
                str(p),
                "--local-scheduler",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for p in (first, second)
    ]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    a, b = load_config(first), load_config(second)
    assert Layout(a).features_cache("train") == Layout(b).features_cache("train")
    assert sorted(p.name.split("-")[0] for p in Layout(a).features_cache("train").parent.glob("*.h5")) == [
        "dev",
        "train",
    ]
    assert Layout(a).train_run.root != Layout(b).train_run.root
    for config, hidden in ((a, 32), (b, 24)):
        report = json.loads((Layout(config).train_run.root / "train_report.json").read_text())
        assert report["epochs_completed"] == 1
        assert (
            yaml.safe_load((Layout(config).train_run.root / "config.yaml").read_text())["model"][
                "deepspeech"
            ]["n_hidden"]
            == hidden
        )
