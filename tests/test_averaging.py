"""Checkpoint averaging (export.average): which epochs, Train keeping them whatever max_to_keep, an export
whose weights are the mean of the checkpoints, Evaluate's dev figures of the mean beside the single best."""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import numpy as np
import pytest
import tensorflow as tf

from native_client.alphabet import load_alphabet
from pipeline.config import AverageConfig, ConfigError
from pipeline.config_loader import config_from_dict, load_config
from pipeline.dag import upstream
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from pipeline.model import build_model
from pipeline.model.averaging import Averaging, stage_model, wanted_epochs
from pipeline.model.checkpoints import checkpoint_key
from pipeline.model.heads import task_weight_names
from pipeline.model.weights import named_weights
from pipeline.reports import DevFigures, ExportRecord, TrainReport, read_report
from pipeline.stages.evaluate import evaluate_stage
from pipeline.stages.export import export_stage
from pipeline.stages.features import features_stage
from pipeline.stages.train import train_stage
from pipeline.train.distribute import make_strategy
from pipeline.train.history import TrainHistory
from pipeline.train.loop import Trainer
from pipeline.train.tasks import TaskData
from tests.conftest import SAMPLE, build_features
from tests.test_trainer import FAMILY_MODELS


def test_the_epochs_an_average_wants():
    figures = [
        DevFigures(epoch=1, dev_loss=5.0, wer=0.9, cer=0.5),
        DevFigures(epoch=2, dev_loss=3.0, wer=0.8, cer=0.4),
        DevFigures(epoch=3, dev_loss=math.nan, wer=0.1, cer=0.1),  # a NaN loss is never among the best
        DevFigures(epoch=4, dev_loss=4.0, wer=0.8, cer=0.3),
        DevFigures(epoch=5, dev_loss=3.0, wer=0.7, cer=0.45),
    ]
    assert wanted_epochs(AverageConfig(last=3), figures, "dev_loss", 5) == [3, 4, 5]
    assert wanted_epochs(AverageConfig(last=9), [], "dev_loss", 2) == [1, 2]
    assert wanted_epochs(AverageConfig(best=2), figures, "dev_loss", 5) == [2, 5]
    assert wanted_epochs(AverageConfig(best=3), figures, "cer", 5) == [2, 4, 5]
    history = TrainHistory(validations=figures)
    for by in ("dev_loss", "cer", "wer"):  # the best one is the single best-dev checkpoint's epoch
        assert wanted_epochs(AverageConfig(best=1), figures, by, 5) == [history.best(by).epoch]


def test_an_average_of_fewer_epochs_than_asked_says_why():
    """best: 5 in a run that validated 2 epochs, last: 5 in a run of 3: the line says the run has fewer."""
    best = Averaging(mode="best", asked=5, epochs=(2, 4), prefixes=("a", "b"), missing=())
    assert best.short and best.describe() == (
        "the average of 2 checkpoints (export.average best 5: epochs 2, 4); the run has only 2 validated "
        "epochs with a finite dev figure, fewer than the 5 asked for"
    )
    last = Averaging(mode="last", asked=5, epochs=(2, 3), prefixes=("b", "c"), missing=(1,))
    assert last.short and last.describe().endswith("; the run has only 3 epochs, fewer than the 5 asked for")
    assert not Averaging(mode="last", asked=2, epochs=(3,), prefixes=("c",), missing=(2,)).short


def test_average_settings_are_checked_and_fingerprinted_only_when_set():
    with pytest.raises(ConfigError, match="export.average: give last or best, not both"):
        config_from_dict({"export": {"average": {"last": 2, "best": 2}}})
    with pytest.raises(ConfigError, match="export.average.best ranks checkpoints by their validation"):
        config_from_dict({"export": {"average": {"best": 2}}, "training": {"validation_epochs": 0}})
    base = Layout(config_from_dict({}))
    unset = Layout(config_from_dict({"export": {"average": {"last": 0}}}))
    averaged = Layout(config_from_dict({"export": {"average": {"last": 3}}}))
    for stage in ("train", "tune", "evaluate", "export"):
        assert unset.fingerprint(stage) == base.fingerprint(stage), stage
    # Keeping checkpoints changes no weight: the run goes on in the same directory.
    assert averaged.train_fingerprint == base.train_fingerprint
    for stage in ("tune", "evaluate", "export"):
        assert averaged.fingerprint(stage) != base.fingerprint(stage), stage
    # Evaluate reads the dev split only to report the average's dev figures.
    data = {"dev_files": [str(SAMPLE / "dev.csv")]}
    dev = ("features", {"split": "dev"})
    assert dev not in upstream(config_from_dict({"data": data}), "evaluate")
    assert dev in upstream(config_from_dict({"data": data, "export": {"average": {"last": 3}}}), "evaluate")
    assert dev not in upstream(averaged.config, "evaluate")  # no dev split: no dev figures


def _checkpoint_weights(prefix, names) -> list[np.ndarray]:
    reader = tf.train.load_checkpoint(str(prefix))
    return [reader.get_tensor(checkpoint_key(name)) for name in names]


def _weight_names(config) -> list[str]:
    layout = Layout(config)
    train = read_cache(layout.features_cache("train"), config.features)
    classes = load_alphabet(layout.alphabet).n_classes
    model = build_model(
        config.model, train.n_input, classes, normalized=config.features.normalize == "global"
    )
    return list(named_weights(model))


@pytest.mark.parametrize("family", ["deepspeech", pytest.param("transducer", marks=pytest.mark.long)])
def test_last_3_exports_the_mean_of_three_checkpoints_and_evaluate_reports_both_dev_figures(
    small_config, family
):
    """max_to_keep 1, yet Train keeps the weights of the last 3 epoch ends; the export's weights are their
    mean (read from its SavedModel); Evaluate names the average and gives its dev figures beside the single
    best checkpoint's. A transducer's predictor and joiner are averaged with the rest."""
    extra = FAMILY_MODELS[family] + (
        "training:\n  epochs: 4\n  max_to_keep: 1\n  checkpoint_secs: 100000\n  learning_rate: 0.003\n"
        "export:\n  average: {last: 3}\n  card: {evaluation: true}\n"
    )
    config = load_config(small_config(limit_train=8, extra=extra))
    build_features(config)
    layout = Layout(config)
    train = train_stage(layout)
    run = layout.train_run
    assert train.epochs_completed == 4 and len(list(run.checkpoints.glob("ckpt-*.index"))) == 1
    kept = sorted(p.name for p in run.epoch_ends.glob("*.index"))
    assert kept == ["epoch-2.index", "epoch-3.index", "epoch-4.index"], kept
    names = _weight_names(config)
    epochs = [_checkpoint_weights(run.epoch_end(e), names) for e in (2, 3, 4)]
    # The kept weights are the epoch ends': the last is the run's final checkpoint.
    final = _checkpoint_weights(train.latest_checkpoint, names)
    assert all(np.array_equal(a, b) for a, b in zip(epochs[2], final, strict=True))

    evaluation = evaluate_stage(layout, beam=False)
    average = evaluation.average
    assert average["mode"] == "last" and average["asked"] == 3 and average["epochs"] == [2, 3, 4]
    assert average["missing"] == [] and evaluation.checkpoint.startswith("average of ")
    assert {"loss", "wer", "cer"} <= set(average["dev"]) and math.isfinite(average["dev"]["loss"])
    best = train.best_dev
    assert average["best_dev"] == {
        "epoch": best.epoch,
        "loss": best.dev_loss,
        "wer": best.wer,
        "cer": best.cer,
    }
    text = layout.evaluation_text(layout.evaluate_dir).read_text()
    assert "Model: the average of 3 checkpoints (export.average last 3: epochs 2, 3, 4)" in text
    assert "Dev (greedy), the average: WER" in text
    assert f"Dev (greedy), the single best checkpoint (epoch {best.epoch}): WER" in text
    saved = json.loads(layout.evaluation_report(layout.evaluate_dir).read_text())
    assert saved["average"]["dev"] == average["dev"]

    export = export_stage(layout, with_lm=False)
    metadata = read_report(export.metadata, ExportRecord)
    assert metadata.checkpoint == evaluation.checkpoint
    # The card says the weights are an average, and gives the single best's figures as that, not as its own.
    assert metadata.card["training"]["average"] == {
        "mode": "last",
        "asked": 3,
        "epochs": [2, 3, 4],
        "missing": [],
    }
    assert metadata.card["evaluation"]["dev_average"] == average["dev"]
    card = export.file("model_card").read_text()
    assert "- Weights: the mean of 3 epoch-end checkpoints (export.average last 3: epochs 2, 3, 4)" in card
    assert (
        f"- Best dev of a single checkpoint (epoch {best.epoch}, greedy decoding), not of this averaged"
        in card
    )
    assert f"- Dev, this averaged model, greedy: WER {average['dev']['wer']:.4f}" in card
    reader = tf.train.load_checkpoint(str(export.file("saved_model") / "variables" / "variables"))
    exported = [reader.get_tensor(f"weights/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(len(names))]
    for index, weight in enumerate(exported):
        mean = (epochs[0][index].astype(np.float64) + epochs[1][index] + epochs[2][index]) / 3
        np.testing.assert_allclose(weight, mean, rtol=1e-6, atol=1e-7, err_msg=names[index])
    # Three different checkpoints: their mean is none of them.
    for single in epochs:
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(exported, single, strict=True)) > 1e-4


def test_a_run_trained_without_the_setting_averages_what_it_kept_and_says_so(small_config, caplog):
    """Set after training (the Train run is the same), {last: 3} finds the last 2 epoch ends among the
    run's checkpoints (max_to_keep 2), averages those and names the missing epoch in the log and report."""
    extra = "training:\n  epochs: 4\n  max_to_keep: 2\n  checkpoint_secs: 100000\n  validation_epochs: 0\n"
    plain = load_config(small_config(limit_train=8, extra=extra))
    build_features(plain)
    train_stage(Layout(plain))
    averaged = load_config(
        small_config("avg.yaml", limit_train=8, extra=extra + "export:\n  average: {last: 3}\n")
    )
    layout = Layout(averaged)
    assert layout.train_run.root == Layout(plain).train_run.root and not layout.train_run.epoch_ends.exists()
    with caplog.at_level(logging.WARNING):
        evaluation = evaluate_stage(layout, beam=False)
    assert evaluation.average["epochs"] == [3, 4] and evaluation.average["missing"] == [2]
    assert evaluation.average["best_dev"] is None  # no validation
    assert all("/checkpoints/ckpt-" in prefix for prefix in evaluation.average["checkpoints"])
    warnings = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "average" in r.getMessage()
    ]
    assert warnings == [
        "Using the average of 2 checkpoints (export.average last 3: epochs 3, 4); epochs 2 wanted but not "
        "kept by the run, so averaged without them"
    ], warnings


def test_damaged_kept_weights_are_left_out_for_another_checkpoint_of_their_epoch(small_config, caplog):
    """Kept weights damaged on disk (a truncated data file, an empty index) never stop Evaluate with a
    traceback nor go into the mean: each is left out with a warning, for the run's own checkpoint of the
    same epoch when there is one (the last epoch's is checkpoints/ckpt-6), else its epoch is missing."""
    extra = (
        "training:\n  epochs: 3\n  max_to_keep: 1\n  checkpoint_secs: 100000\n  validation_epochs: 0\n"
        "export:\n  average: {last: 2}\n"
    )
    config = load_config(small_config(limit_train=8, extra=extra))
    build_features(config, ("train", "dev"))
    layout = Layout(config)
    train = train_stage(layout)
    run = layout.train_run
    names = _weight_names(config)
    epoch_2 = _checkpoint_weights(run.epoch_end(2), names)
    final = _checkpoint_weights(train.latest_checkpoint, names)
    data = next(run.epoch_ends.glob("epoch-3.data-*"))
    data.write_bytes(data.read_bytes()[:100])  # a data file shorter than its index says
    n_input = read_cache(layout.features_cache("train"), config.features).n_input
    n_classes = load_alphabet(layout.alphabet).n_classes

    with caplog.at_level(logging.WARNING):
        model, name, averaging = stage_model(config, run, None, n_input, n_classes)
    assert averaging.epochs == (2, 3) and averaging.missing == ()
    assert averaging.prefixes == (str(run.epoch_end(2)), train.latest_checkpoint)
    assert averaging.damaged == (str(run.epoch_end(3)),)
    assert any(f"{run.epoch_end(3)}: damaged checkpoint left out" in r.getMessage() for r in caplog.records)
    weights = [v.numpy() for v in named_weights(model).values()]
    for index, weight in enumerate(weights):
        mean = (epoch_2[index].astype(np.float64) + final[index]) / 2
        np.testing.assert_allclose(weight, mean, rtol=1e-6, atol=1e-7, err_msg=names[index])

    (run.epoch_end(2).parent / "epoch-2.index").write_bytes(b"")  # no other checkpoint of epoch 2
    _, _, averaging = stage_model(config, run, None, n_input, n_classes)
    assert averaging.epochs == (3,) and averaging.missing == (2,) and len(averaging.damaged) == 2
    assert averaging.to_dict()["damaged"] == [str(run.epoch_end(2)), str(run.epoch_end(3))]


class _Killed(Exception):  # noqa: N818 - stands for a kill, not an error
    """Raised instead of a save: the process dies at that point, before the save."""


def test_a_kill_before_an_epochs_checkpoint_loses_no_weights_the_last_checkpoint_wants(small_config):
    """{last: 2}, max_to_keep 1: killed right before the checkpoint of epoch 3, the run's last checkpoint
    is epoch 2's, whose average is of epochs 1 and 2: both are still kept, so a run then ended there
    (training.epochs lowered to 2) averages them; resumed to epoch 3 instead, it keeps epochs 2 and 3."""
    extra = (
        "training:\n  epochs: 3\n  max_to_keep: 1\n  checkpoint_secs: 100000\n  validation_epochs: 0\n"
        "export:\n  average: {last: 2}\n"
    )
    config = load_config(small_config(limit_train=8, extra=extra))
    build_features(config, ("train", "dev"))
    layout = Layout(config)
    train = read_cache(layout.features_cache("train"), config.features)
    alphabet = load_alphabet(layout.alphabet)
    trainer = Trainer(
        config,
        layout.train_run.root,
        [TaskData.only(train, None, alphabet)],
        make_strategy(config.distribution),
    )
    save = trainer.checkpoints.save

    def killed_at_the_end_of_epoch_3():
        if int(trainer.state.epoch.numpy()) == 3:
            raise _Killed
        save()

    trainer.checkpoints.save = killed_at_the_end_of_epoch_3
    with pytest.raises(_Killed):
        trainer.fit()
    run = layout.train_run
    assert {1, 2} <= {int(p.name[6:-6]) for p in run.epoch_ends.glob("*.index")}

    ended = load_config(
        small_config("ended.yaml", limit_train=8, extra=extra.replace("epochs: 3", "epochs: 2"))
    )
    assert train_stage(Layout(ended)).epochs_completed == 2
    _, _, averaging = stage_model(ended, run, None, train.n_input, alphabet.n_classes)
    assert averaging.epochs == (1, 2) and averaging.missing == ()
    assert averaging.prefixes == (str(run.epoch_end(1)), str(run.epoch_end(2)))

    assert train_stage(layout).epochs_completed == 3
    assert sorted(p.name for p in run.epoch_ends.iterdir()) == [
        "epoch-2.data-00000-of-00001",
        "epoch-2.index",
        "epoch-3.data-00000-of-00001",
        "epoch-3.index",
    ]


def test_best_2_keeps_the_two_best_validated_epochs(small_config):
    extra = (
        "training:\n  epochs: 5\n  max_to_keep: 1\n  checkpoint_secs: 100000\n  learning_rate: 0.01\n"
        "  best_by: cer\nexport:\n  average: {best: 2}\n"
    )
    config = load_config(small_config(limit_train=8, extra=extra))
    build_features(config, ("train", "dev"))
    report = train_stage(Layout(config))
    assert read_report(Layout(config).train_run.report, TrainReport).validations == report.validations
    figures = [DevFigures(**v) for v in report.validations]
    wanted = wanted_epochs(config.export.average, figures, "cer", 5)
    kept = sorted(int(p.name[6:-6]) for p in Layout(config).train_run.epoch_ends.glob("*.index"))
    assert kept == wanted and len(kept) == 2 and report.best_dev.epoch in kept, (kept, figures)


@pytest.mark.long
@pytest.mark.slow
def test_a_task_of_a_multitask_run_exports_the_mean_of_three_checkpoints(tmp_path, caplog):
    """Two tasks with a head each, {last: 3}, max_to_keep 1: Train keeps the whole multi-task model's last
    3 epoch ends; task fr's Evaluate and Export use the mean of the shared encoder and fr's head over them
    (read from the export's SavedModel); its report gives the average's dev figures beside the single
    best's, fr's own; its card says the weights are an average. {last: 5} then averages what is kept."""
    from tests.test_multitask_train import _stored, two_tasks

    extra = (
        "training: {epochs: 4, max_to_keep: 1, checkpoint_secs: 100000, learning_rate: 0.003}\n"
        "export: {average: {last: 3}, card: {evaluation: true}}\n"
    )
    config = two_tasks(tmp_path, extra=extra)
    layout = Layout(config)
    fr = layout.for_task("fr")
    features_stage(fr, "test")
    train = train_stage(layout)
    run = layout.train_run
    assert train.epochs_completed == 4 and len(list(run.checkpoints.glob("ckpt-*.index"))) == 1
    assert sorted(p.name for p in run.epoch_ends.glob("*.index")) == [f"epoch-{e}.index" for e in (2, 3, 4)]
    epochs = [_stored(str(run.epoch_end(e))) for e in (2, 3, 4)]
    assert {"layer_1.kernel", "heads.en.kernel", "heads.fr.kernel"} <= set(epochs[0])  # the whole model
    final = _stored(train.latest_checkpoint)
    assert all(np.array_equal(epochs[2][name], final[name]) for name in final)

    evaluation = evaluate_stage(fr, beam=False)
    average = evaluation.average
    assert (average["mode"], average["epochs"], average["missing"]) == ("last", [2, 3, 4], [])
    assert evaluation.checkpoint == "average of " + ", ".join(str(run.epoch_end(e)) for e in (2, 3, 4))
    assert math.isfinite(average["dev"]["loss"])
    best = train.best_dev
    own = best.tasks["fr"]  # fr's figures in the best validation, not the tasks' weighted mean
    assert own["dev_loss"] != best.dev_loss
    assert average["best_dev"] == {
        "epoch": best.epoch,
        "loss": own["dev_loss"],
        "wer": own["wer"],
        "cer": own["cer"],
    }
    text = fr.evaluation_text(fr.evaluate_dir).read_text()
    assert "Model: the average of 3 checkpoints (export.average last 3: epochs 2, 3, 4)" in text
    assert f"Dev (greedy), the average: WER {average['dev']['wer']:.4f}" in text
    assert (
        f"Dev (greedy), the single best checkpoint (epoch {best.epoch}, chosen by the tasks' weighted mean; "
        f"task fr's figures): WER {own['wer']:.4f}" in text
    )

    export = export_stage(fr, with_lm=False)
    metadata = read_report(export.metadata, ExportRecord)
    assert metadata.task == "fr" and metadata.checkpoint == evaluation.checkpoint
    assert metadata.card["training"]["average"]["epochs"] == [2, 3, 4]
    assert metadata.card["training"]["best_dev"]["dev_loss"] == own["dev_loss"]
    # the card's training data is fr's own (its manifests, its 4 rows), not the run's sum over the tasks
    assert metadata.card["training_data"]["samples"] == 4 == train.tasks[1]["train_samples"]
    assert metadata.card["training_data"]["manifests"] == ["train.csv"]
    assert metadata.card["evaluation"]["dev_average"] == average["dev"]
    card = export.file("model_card").read_text()
    assert "- Weights: the mean of 3 epoch-end checkpoints (export.average last 3: epochs 2, 3, 4)" in card
    # The export's weights, in the order of fr's single-task model, each read from the multi-task names.
    view = fr.config
    n_classes = load_alphabet(fr.alphabet).n_classes
    n_input = read_cache(fr.features_cache("train"), view.features).n_input
    model = build_model(view.model, n_input, n_classes)
    names = list(named_weights(model))
    stored = task_weight_names(view, model)
    assert stored[names[-1]].startswith("heads.fr.") and stored[names[0]] == names[0]
    reader = tf.train.load_checkpoint(str(export.file("saved_model") / "variables" / "variables"))
    exported = [reader.get_tensor(f"weights/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(len(names))]
    for name, weight in zip(names, exported, strict=True):
        ends = [e[stored[name]].astype(np.float64) for e in epochs]
        np.testing.assert_allclose(weight, sum(ends) / 3, rtol=1e-6, atol=1e-7, err_msg=name)
        assert min(float(np.max(np.abs(weight - end))) for end in ends) > 1e-6, name  # none of them

    # Five asked of a run of four whose epoch 1 was not kept as an epoch end: the epochs it has (epoch 1
    # too when the best-dev checkpoint is of it), and a warning saying so.
    five = dataclasses.replace(
        config, export=dataclasses.replace(config.export, average=AverageConfig(last=5))
    )
    with caplog.at_level(logging.WARNING):
        _, _, averaging = stage_model(five.task_view("fr"), run, None, n_input, n_classes)
    assert {2, 3, 4} <= set(averaging.epochs) and averaging.short
    assert sorted(averaging.epochs + averaging.missing) == [1, 2, 3, 4]
    assert any(
        "the run has only 4 epochs, fewer than the 5 asked for" in r.getMessage() for r in caplog.records
    )
