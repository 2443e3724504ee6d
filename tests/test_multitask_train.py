"""Issue 34 item 3: the multi-task trainer, for real on two tasks cut from the sample corpus (task ``fr``
is the sample's other speakers, with an alphabet of its own: the point is two heads over one encoder)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.batches.tasks import epoch_tasks
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.model.checkpoints import resolve_checkpoint
from pipeline.model.heads import MultiTaskModel
from pipeline.reports import EvaluationReport
from pipeline.stages.alphabet import alphabet_stage
from pipeline.stages.evaluate import evaluate_stage
from pipeline.stages.features import features_stage
from pipeline.stages.train import task_data, train_stage
from pipeline.train.hooks import StepInfo, StopTraining, TrainHooks
from tests.conftest import ROOT
from tests.corpus_factory import sample_rows, write_manifest
from tests.towers import compare_runs

pytestmark = pytest.mark.slow


def _manifest(folder, split, start, count):
    folder.mkdir(parents=True, exist_ok=True)
    rows = sample_rows(split, start + count)[start:]
    return write_manifest(folder / f"{split}.csv", [(str(audio), text) for audio, text in rows])


def two_tasks(
    tmp_path,
    name: str = "multi.yaml",
    work: str = "work",
    multitask: str = "",
    weights=(1.0, 0.5),
    extra: str = "",
    fr_model: str = "{}",
):
    """A tiny two-task config over the sample corpus: en (8 train, 4 dev rows; the English alphabet) and fr
    (4 train, 3 dev rows, its dev rows also its test split; its own alphabet), weighted 1 and 0.5. Its
    features are built. ``multitask``: keys of the multitask section; ``extra``: other sections;
    ``fr_model``: task fr's model keys (a YAML flow mapping)."""
    corpus = tmp_path / "corpus"
    en = {"train": _manifest(corpus / "en", "train", 0, 8), "dev": _manifest(corpus / "en", "dev", 0, 4)}
    fr = {"train": _manifest(corpus / "fr", "train", 8, 4), "dev": _manifest(corpus / "fr", "dev", 4, 3)}
    base = tmp_path / f"{name}.base.yaml"
    base.write_text(
        textwrap.dedent(f"""
        extends: {ROOT / "configs" / "sample.yaml"}
        paths: {{work_dir: {tmp_path / work}}}
        data: {{limit_train: 0, limit_dev: 0, limit_test: 0, max_reject_fraction: 0.5}}
        features: {{workers: 1}}
        model: {{n_hidden: 32, dropout_rate: 0.0}}
        training: {{epochs: 2, batch_size: 4, dev_batch_size: 8, report_count: 1}}
        early_stop: {{rule: "off"}}
        augment: {{speed_factors: []}}
        decoder: {{type: greedy}}
        multitask:
          tasks:
            - name: en
              weight: {weights[0]}
              data: {{train_files: [{en["train"]}], dev_files: [{en["dev"]}], test_files: []}}
            - name: fr
              weight: {weights[1]}
              data: {{train_files: [{fr["train"]}], dev_files: [{fr["dev"]}], test_files: [{fr["dev"]}]}}
              paths: {{alphabet: auto}}
              model: {fr_model}
        """)
        + textwrap.indent(textwrap.dedent(multitask), "  ")
    )
    path = tmp_path / name
    path.write_text(f"extends: {base.name}\n" + textwrap.dedent(extra))
    config = load_config(path)
    layout = Layout(config)
    alphabet_stage(layout.for_task("fr"))
    for task in config.tasks:
        for split in ("train", "dev"):
            features_stage(layout.for_task(task), split)
    return config


def _stored(prefix: str) -> dict:
    reader = tf.train.load_checkpoint(prefix)
    return {
        key.split("/")[1].replace("..", "."): reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key.startswith("weights/")
    }


def test_heads_train_one_encoder_and_a_head_per_task_validated_per_task(tmp_path):
    config = two_tasks(tmp_path)
    layout = Layout(config)
    report = train_stage(layout)
    tasks = {task["name"]: task for task in report.tasks}
    # proportional: an epoch is every batch of every task once (en 2 batches of 4, fr 1)
    assert (report.steps_per_epoch, report.global_step) == (3, 6)
    assert (tasks["en"]["batches_drawn"], tasks["fr"]["batches_drawn"]) == (4, 2)
    assert (tasks["en"]["loss_factor"], tasks["fr"]["loss_factor"]) == (
        pytest.approx(4 / 3),
        pytest.approx(2 / 3),
    )
    assert report.train_samples == 12
    for validation in report.validations:
        en, fr = validation["tasks"]["en"], validation["tasks"]["fr"]
        for key in ("dev_loss", "wer", "cer"):  # the policy reads the weighted mean (weights 1 and 0.5)
            assert validation[key] == pytest.approx((en[key] + 0.5 * fr[key]) / 1.5)
    assert report.validations[-1]["dev_loss"] < report.validations[0]["dev_loss"]
    assert set(report.last_samples) == {"en", "fr"}
    for task in ("en", "fr"):
        events = EventAccumulator(str(layout.train_run.summaries / f"dev_{task}")).Reload()
        assert {"loss", "wer", "cer"} <= set(events.Tags()["tensors"])
        assert len(events.Tensors("loss")) == 2

    # one encoder, a head per task, named apart in the checkpoint
    stored = _stored(resolve_checkpoint(layout.train_run.best))
    assert {"layer_1.kernel", "heads.en.kernel", "heads.fr.kernel", "heads.fr.bias"} <= set(stored)
    assert not any(name.startswith("layer_6") for name in stored)
    fr_classes = task_data(layout)[1].alphabet.n_classes
    assert stored["heads.fr.kernel"].shape == (32, fr_classes) != stored["heads.en.kernel"].shape

    # Evaluate of task fr reads the shared encoder and fr's head: on the dev rows, the loss the best
    # validation measured for fr
    features_stage(layout.for_task("fr"), "test")
    evaluation = evaluate_stage(layout.for_task("fr"), beam=False)
    assert isinstance(evaluation, EvaluationReport)
    assert evaluation.loss == pytest.approx(report.best_dev.tasks["fr"]["dev_loss"], rel=1e-4)


def _stop_at(step: int) -> TrainHooks:
    def on_step(info: StepInfo) -> None:
        if info.step == step:
            raise StopTraining

    return TrainHooks(on_step=on_step)


def test_a_step_moves_the_heads_of_its_tasks_only(tmp_path):
    """proportional: a step of one task changes the encoder and that task's head; the other head keeps
    its weights (no Adam momentum carries it: the update leaves its variables out)."""
    config = two_tasks(tmp_path)
    layout = Layout(config)
    with pytest.raises(StopTraining):
        train_stage(layout, hooks=_stop_at(1))
    stored = _stored(tf.train.latest_checkpoint(str(layout.train_run.checkpoints)))
    tasks = task_data(layout)
    classes = tuple(task.alphabet.n_classes for task in tasks)
    initial = MultiTaskModel(config.model, "heads", ("en", "fr"), tasks[0].train.n_input, classes)
    (drawn,) = epoch_tasks("proportional", [2, 1], 0, config.training.shuffle_seed)[0]
    moved = {
        name for name, value in initial.named_weights().items() if not np.array_equal(value, stored[name])
    }
    names = ("en", "fr")
    assert {"layer_1.kernel", "lstm.lstm_cell.kernel", f"heads.{names[drawn]}.kernel"} <= moved
    assert not any(name.startswith(f"heads.{names[1 - drawn]}.") for name in moved), sorted(moved)


@pytest.mark.parametrize("sharing", ["heads", "separate"])
def test_a_stopped_run_resumes_every_task_where_it_was(tmp_path, sharing):
    """round_robin over tasks of 2 and 1 batches (fr goes round its plan twice an epoch): stopped after
    step 3 (in epoch 2) and resumed, the run ends with the weights of one never interrupted; the
    checkpoint holds the tasks' positions."""
    multitask = f"sharing: {sharing}\nsampling: round_robin\n"
    stopped = two_tasks(tmp_path, "stopped.yaml", "stopped", multitask)
    layout = Layout(stopped)
    with pytest.raises(StopTraining):
        train_stage(layout, hooks=_stop_at(3))
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(layout.train_run.checkpoints)))
    assert reader.get_tensor("task_batches/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [3, 3]
    resumed = train_stage(layout)
    assert resumed.global_step == 4 and [t["batches_drawn"] for t in resumed.tasks] == [4, 4]
    clean = train_stage(Layout(two_tasks(tmp_path, "clean.yaml", "clean", multitask)))
    assert resumed.weights_sha256 == clean.weights_sha256


@pytest.mark.long
def test_only_the_ratio_of_the_tasks_weights_counts(tmp_path):
    """Each task's loss is scaled by its weight over the mean weight: weights 2 and 1 train what 1 and 0.5
    do, bit for bit."""
    multitask = "sampling: round_robin\n"
    half = train_stage(Layout(two_tasks(tmp_path, "a.yaml", "a", multitask, weights=(1.0, 0.5))))
    double = train_stage(Layout(two_tasks(tmp_path, "b.yaml", "b", multitask, weights=(2.0, 1.0))))
    assert [t["loss_factor"] for t in double.tasks] == [pytest.approx(4 / 3), pytest.approx(2 / 3)]
    assert half.weights_sha256 == double.weights_sha256


@pytest.mark.long
@pytest.mark.parametrize(
    "batches",
    ["global_batch_size: 8, batch_size: 4", "global_batch_size: 4, accumulate_batches: 2"],
    ids=["step", "windows"],
)
def test_two_towers_train_the_tasks_as_one_device_does(tmp_path, batches):
    """Towers as for one task: each task's batch is split over two CPU towers, and the update is the
    one-device update to float rounding (round_robin, both heads in every step); likewise in update
    windows of 2 steps (each tower's gradients summed over the window, then over the towers, once)."""
    multitask = "sampling: round_robin\n"
    common = f"training: {{epochs: 2, {batches}, dev_batch_size: 8, report_count: 1}}\n"
    one = two_tasks(
        tmp_path, "one.yaml", "one", multitask, extra=common + "distribution: {strategy: one_device}\n"
    )
    two = two_tasks(
        tmp_path,
        "two.yaml",
        "one",
        multitask,
        extra=common + "distribution: {strategy: mirrored, cpu_devices: 2}\n",
    )
    runs, diff, count = compare_runs(one.source, two.source)
    assert [towers for towers, _, _ in runs] == [1, 2], runs
    line = f"MAXDIFF {diff} {count}"
    assert count == 17  # the encoder's 11 weights, the two heads' 2 each, the normalisation's mean and std
    assert diff < 5e-5, line


@pytest.mark.long
@pytest.mark.usefixtures("tasks_in_process")
@pytest.mark.parametrize("accumulate", [1, 2])
def test_two_local_workers_train_the_tasks_to_identical_weights(tmp_path, accumulate):
    """Multi-worker as for one task: the Train task starts two local workers, each task's global batch
    is split over them, and both end with the same weights, the chief's report's; likewise with update
    windows of 2 steps (the accumulated gradients all-reduced over the workers once per window)."""
    import json

    import luigi

    from tasks import Train

    distribution = "distribution: {strategy: multi_worker, collective_timeout_s: 20, local_workers: 2}\n"
    training = (
        f"training: {{epochs: 2, batch_size: 4, accumulate_batches: {accumulate}, dev_batch_size: 8}}\n"
    )
    config = two_tasks(tmp_path, extra=distribution + training)
    assert luigi.build([Train(config=config.source)], local_scheduler=True)
    run = Layout(config).train_run
    report = json.loads(run.report.read_text())
    # global batch 2 workers x 4: en's 8 rows one batch, fr's 4 one batch; proportional, 2 epochs
    assert report["global_step"] == 4 and [t["batches_drawn"] for t in report["tasks"]] == [2, 2]
    assert report["updates"] == 4 // accumulate
    results = [
        json.loads(
            [line for line in run.worker_log(i).read_text().splitlines() if line.startswith('{"worker"')][-1]
        )
        for i in (0, 1)
    ]
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"] == report["weights_sha256"]


@pytest.mark.long
def test_a_multitask_config_of_one_task_stays_a_multitask_run(tmp_path):
    """Issue 44's one trainer: a multi-task config that lists one task keeps what a multi-task run has (the
    multi-task model with its heads' names, the task's position in the checkpoint, the task in the
    report), which its Evaluate and Export read; it does not become a single-task run."""
    import dataclasses

    from pipeline.train.distribute import make_strategy
    from pipeline.train.loop import Trainer

    config = two_tasks(tmp_path, extra="training: {epochs: 1}\n")
    one = dataclasses.replace(
        config, multitask=dataclasses.replace(config.multitask, tasks=config.multitask.tasks[:1])
    )
    trainer = Trainer(one, tmp_path / "run", task_data(Layout(config))[:1], make_strategy(one.distribution))
    report = trainer.fit()
    assert isinstance(trainer.model, MultiTaskModel)
    assert [task["name"] for task in report.tasks] == ["en"]
    assert report.validations[0]["tasks"].keys() == {"en"}
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints")))
    assert reader.get_tensor("task_batches/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [report.global_step]
