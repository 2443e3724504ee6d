"""Issue 47: a transducer head beside CTC heads. Task fr of the two-task config (test_multitask_train.py)
is trained for ``model.objective: transducer`` while en stays CTC: one encoder, en's CTC head, fr's
projection with its predictor and joiner; validated, evaluated and exported each for its own objective."""

from __future__ import annotations

import json

import numpy as np
import pytest

from native_client.model import open_model
from pipeline.config import ConfigError
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.model.checkpoints import resolve_checkpoint, warm_start
from pipeline.model.heads import task_model
from pipeline.model.normalization import is_normalization_weight
from pipeline.stages.evaluate import evaluate_stage
from pipeline.stages.export import export_stage
from pipeline.stages.features import features_stage
from pipeline.stages.train import task_data, train_stage
from tests.test_multitask_train import _stored, two_tasks

pytestmark = pytest.mark.slow

FR_TRANSDUCER = "{objective: transducer, transducer: {predictor_dim: 16, predictor_groups: 4, joint_dim: 24}}"


def _samples(path) -> np.ndarray:
    import soundfile

    audio, _ = soundfile.read(path, dtype="int16")
    return audio


@pytest.mark.parametrize("sharing", ["heads", pytest.param("separate", marks=pytest.mark.long)])
def test_a_transducer_head_trains_beside_a_ctc_head(tmp_path, sharing):
    config = two_tasks(tmp_path, multitask=f"sharing: {sharing}\n", fr_model=FR_TRANSDUCER)
    layout = Layout(config)
    report = train_stage(layout)
    assert report.global_step == 6
    for validation in report.validations:
        for task in ("en", "fr"):
            assert np.isfinite(validation["tasks"][task]["dev_loss"])
    fr_losses = [v["tasks"]["fr"]["dev_loss"] for v in report.validations]
    assert fr_losses[-1] < fr_losses[0]

    stored = _stored(resolve_checkpoint(layout.train_run.best))
    en_classes, fr_classes = (task.alphabet.n_classes for task in task_data(layout))
    if sharing == "heads":
        # en's CTC head over its labels, fr's head the joiner's projection with fr's predictor and joiner
        assert stored["heads.en.kernel"].shape == (32, en_classes)
        assert stored["heads.fr.kernel"].shape == (32, 24)
        assert stored["heads.fr.transducer.output.kernel"].shape[-1] == fr_classes
        assert not any(name.startswith(("transducer.", "heads.en.transducer")) for name in stored)
        # a warm start counts fr's predictor and joiner as the model's last layer
        fresh, _ = task_model(config, task_data(layout))
        best = resolve_checkpoint(layout.train_run.best)
        weights = {name for name in stored if not is_normalization_weight(name)}  # the run's own statistics
        assert set(warm_start(fresh, best, 0)) == weights
        kept = set(warm_start(fresh, best, 1))
        assert kept == {name for name in weights if not name.startswith("heads.fr.transducer.")}
    else:
        assert stored["tasks.fr.transducer.output.kernel"].shape[-1] == fr_classes
        assert not any(name.startswith("tasks.en.transducer") for name in stored)

    # Evaluate of each task reads its part of the model and scores it for its own objective: on fr's dev
    # rows (its test split), the loss the best validation measured for fr
    features_stage(layout.for_task("fr"), "test")
    evaluation = evaluate_stage(layout.for_task("fr"), beam=False)
    assert evaluation.loss == pytest.approx(report.best_dev.tasks["fr"]["dev_loss"], rel=1e-4)
    assert evaluation.wer_lm is None

    # fr's export is a transducer's (en's a CTC model's), and the client decodes it as Evaluate did
    fr_export = export_stage(layout.for_task("fr"), with_lm=False).root
    metadata = json.loads((fr_export / "metadata.json").read_text())
    assert metadata["format_version"] == 7 and metadata["transducer"]["joint_dim"] == 24
    en_export = export_stage(layout.for_task("en"), with_lm=False).root
    assert "transducer" not in json.loads((en_export / "metadata.json").read_text())
    client = open_model(fr_export, backend="saved_model")
    found = {}
    fr_layout = layout.for_task("fr")
    samples = fr_layout.evaluation_samples(fr_layout.evaluate_dir).read_text().splitlines()
    for line in samples:
        record = json.loads(line)
        found[record["path"]] = record["hypothesis"]
    assert len(found) == evaluation.samples_count >= 2
    for path, prediction in found.items():
        assert client.greedy.decode(client.logits(_samples(path))) == prediction, path


def test_what_a_mixed_multitask_config_cannot_be_is_refused_in_one_line(tmp_path):
    base = two_tasks(tmp_path, fr_model=FR_TRANSDUCER)
    shared = tmp_path / "shared.yaml"
    shared.write_text(f"extends: {base.source}\nmultitask: {{sharing: shared}}\n")
    with pytest.raises(ConfigError, match=r"sharing: shared trains one output layer for one objective"):
        load_config(shared)
    # a task's transducer keys are checked as the top-level ones are
    wrong = tmp_path / "wrong.yaml"
    text = (tmp_path / "multi.yaml.base.yaml").read_text()
    wrong.write_text(text.replace("predictor_groups: 4", "predictor_groups: 5"))
    with pytest.raises(
        ConfigError, match=r"multitask.tasks\[1\] \(fr\).*predictor_groups: 5 does not divide"
    ):
        load_config(wrong)


def test_a_task_s_objective_moves_train_s_fingerprint_only_where_set(tmp_path):
    """Naming the pipeline's own objective for a task (in either spelling), or transducer keys a CTC task
    does not read, moves nothing; another objective moves Train, and so do its transducer keys."""
    fr_models = (
        "{}",
        "{objective: ctc}",
        "{objective: pipeline.model.objectives.ctc}",
        "{transducer: {joint_dim: 48}}",
        FR_TRANSDUCER,
        FR_TRANSDUCER.replace("joint_dim: 24", "joint_dim: 48"),
    )
    configs = [two_tasks(tmp_path, f"{i}.yaml", fr_model=model) for i, model in enumerate(fr_models)]
    fingerprints = [Layout(config).train_run.root.name for config in configs]
    assert len(set(fingerprints[:4])) == 1 and len(set(fingerprints)) == 3, fingerprints


def test_the_dag_has_no_language_model_for_a_transducer_task_and_says_why(tmp_path):
    from pipeline.dag import instances, stage
    from tasks.preflight import PreflightError, stage_tasks

    config = two_tasks(tmp_path, fr_model=FR_TRANSDUCER, extra="decoder: {tune: true}\n")
    for name in ("lm", "tune"):
        assert [p["task"] for p in instances(config, stage(name), {})] == ["en"]
    for command in ("LanguageModel", "TuneDecoder"):
        with pytest.raises(PreflightError, match=r"--task fr: .*model\.objective is transducer: it reads no"):
            stage_tasks(config, command, {"task": "fr"})


def test_onnx_is_refused_only_where_a_transducer_is_exported(tmp_path):
    two_tasks(tmp_path, fr_model=FR_TRANSDUCER)
    base = (tmp_path / "multi.yaml.base.yaml").read_text()
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text(base.replace("paths: {alphabet: auto}", "paths: {alphabet: auto}\n      export: false"))
    onnx = "export: {onnx: true}\n"
    (tmp_path / "a.yaml").write_text(f"extends: quiet.yaml\n{onnx}")
    load_config(tmp_path / "a.yaml")  # fr is trained and evaluated, never exported
    (tmp_path / "b.yaml").write_text(f"extends: multi.yaml.base.yaml\n{onnx}")
    with pytest.raises(
        ConfigError, match=r"multitask.tasks\[1\] \(fr\): export.onnx: .*or export: false for"
    ):
        load_config(tmp_path / "b.yaml")
