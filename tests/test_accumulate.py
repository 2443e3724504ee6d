"""Gradient aggregation (training.accumulate_batches): N batches make one update of a batch N times the
size, the learning-rate schedule counts updates, and a run stopped inside an update window resumes to the
weights of a run never interrupted."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from native_client.alphabet import load_alphabet
from pipeline.batches.dataset import batch_plan, epoch_batches, epoch_windows, plan_digest
from pipeline.config_loader import load_config
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from pipeline.model.weights import named_weights
from pipeline.reports import TrainReport, read_report
from pipeline.stages.train import train_stage
from pipeline.stages.train_launch import SignalStop, stop_on_signals
from pipeline.train.distribute import make_strategy
from pipeline.train.hooks import StopTraining, TrainHooks
from pipeline.train.loop import Trainer
from pipeline.train.tasks import TaskData, plan_windows
from tests.conftest import ROOT, build_features
from tests.plugins.step_barrier import StepBarrier
from tests.towers import compare_runs


def test_windows_keep_consecutive_plan_steps_together_and_one_step_windows_are_the_old_order():
    plan = batch_plan(np.arange(1, 41, dtype=np.int32), 4, 1)  # 10 steps of 4 utterances
    assert [list(w) for w in epoch_windows(len(plan), 0, 7, 1)] == [
        [i] for i in np.random.default_rng(7).permutation(10)
    ]
    windows = epoch_windows(len(plan), 3, 7, 4)  # 4 + 4 + 2 steps
    assert sorted(len(w) for w in windows) == [2, 4, 4]
    assert sorted(i for w in windows for i in w) == list(range(10))
    assert all(list(w) == list(range(w.start, w.stop)) for w in windows)
    ordered = epoch_batches(plan, 3, 7, 4)
    assert [list(b) for b in ordered] == [list(plan[i]) for w in windows for i in w]
    layout = plan_windows(plan, 3, 7, 4)
    sizes = [len(w) * 4 for w in windows]
    assert layout.ends == frozenset(np.cumsum([len(w) for w in windows]).tolist())
    # each batch weighs 1 over its window's utterances (the window's shorter last one included)
    assert layout.coefficients == tuple(
        (1 / size,) for w, size in zip(windows, sizes, strict=True) for _ in w
    )
    assert plan_digest(plan) != plan_digest(plan, 2) and plan_digest(plan, 1) == plan_digest(plan)


def test_plan_windows_weigh_each_batch_by_its_own_windows_utterances_wherever_the_short_one_falls():
    """Batches of unequal sizes, windows of 2 over 5 steps (the short window shuffled anywhere): each step's
    coefficient is 1 over its own window's utterances, its share its batch's part of them, and the ends
    fall after each window as the epoch orders them."""
    plan = [np.arange(size) for size in (3, 4, 2, 5, 1)]
    short_in_the_middle = 0
    for epoch in range(6):
        windows = epoch_windows(len(plan), epoch, 7, 2)
        short_in_the_middle += len(windows[1]) == 1
        got = plan_windows(plan, epoch, 7, 2)
        totals = [sum(len(plan[i]) for i in w) for w in windows]
        assert got.coefficients == tuple((1 / t,) for w, t in zip(windows, totals, strict=True) for _ in w)
        shares = [len(plan[i]) / t for w, t in zip(windows, totals, strict=True) for i in w]
        assert got.shares == pytest.approx(shares)
        assert got.ends == frozenset(np.cumsum([len(w) for w in windows]).tolist())
    assert short_in_the_middle, "no epoch put the short window in the middle: pick other epochs"


def _weights(model) -> dict[str, np.ndarray]:
    return {name: variable.numpy() for name, variable in named_weights(model).items()}


def _fit(config, run_dir, hooks=None):
    layout = Layout(config)
    train = read_cache(layout.features_cache("train"), config.features)
    alphabet = load_alphabet(layout.alphabet)
    trainer = Trainer(
        config,
        run_dir,
        [TaskData.only(train, None, alphabet)],
        make_strategy(config.distribution),
        hooks=hooks,
    )
    return trainer, trainer.fit()


@pytest.mark.parametrize("family", ["deepspeech", pytest.param("transducer", marks=pytest.mark.long)])
def test_two_batches_of_8_make_the_update_of_one_batch_of_16(small_config, tmp_path, family):
    """Towers off, float32, dropout 0: accumulate_batches 2 at batch 8 ends with the weights of batch 16
    after 6 updates, to float rounding, with an exponential decay of the learning rate at every update (a
    schedule counting batches would decay twice as fast). A transducer's too, over DeepSpeech's encoder (the
    Conformer draws a chunk size per step, so its batch of 16 is not two of 8)."""
    common = ACCUMULATED_MODELS[family] + (
        "distribution:\n  strategy: one_device\n"
        "training:\n  epochs: 3\n  validation_epochs: 0\n  learning_rate: 0.003\n  lr_decay: exponential\n"
        "  decay_steps: 1\n  decay_rate: 0.7\n  precision: float32\n"
    )
    big = load_config(small_config("big.yaml", limit_train=32, extra=common + "  batch_size: 16\n"))
    small = load_config(
        small_config(
            "small.yaml", limit_train=32, extra=common + "  batch_size: 8\n  accumulate_batches: 2\n"
        )
    )
    assert Layout(big).train_run.root != Layout(small).train_run.root
    build_features(big, ("train",))
    big_trainer, big_report = _fit(big, tmp_path / "big")
    small_trainer, small_report = _fit(small, tmp_path / "small")
    assert (big_report.global_step, big_report.updates) == (6, 6)
    assert (small_report.global_step, small_report.updates) == (12, 6)
    assert small_report.accumulate_batches == 2 and small_report.steps_per_epoch == 4
    assert int(small_trainer.optimizer.iterations.numpy()) == 6
    assert small_trainer._learning_rate() == pytest.approx(0.003 * 0.7**6)
    one, other = _weights(big_trainer.model), _weights(small_trainer.model)
    if family == "deepspeech":  # its 13 and the normalisation's mean and std (the sample normalises)
        assert len(one) == 15
    else:
        assert {"transducer.predictor.embedding.embeddings", "transducer.output.kernel"} <= set(one)
    start = _weights_at_start(big)  # the trained ones
    moved = max(float(np.max(np.abs(one[k] - start[k]))) for k in start)
    difference = max(float(np.max(np.abs(one[k] - other[k]))) for k in one)
    # Float rounding only (two gradients summed, then Adam's g / (|g| + eps) magnifies the rounding of the
    # smallest); a wrong reduction (each batch its own mean) or a schedule counting batches is ~1e-3 off.
    assert moved > 1e-3 and difference < 5e-5, (moved, difference)
    # The mean train loss of each epoch is the mean of the same utterances' losses.
    big_losses = [e["train_loss"] for e in big_report.train_losses]
    small_losses = [e["train_loss"] for e in small_report.train_losses]
    np.testing.assert_allclose(small_losses, big_losses, rtol=1e-4)


# DeepSpeech, plain and as a transducer's encoder (its predictor and joiner as the step's weights)
ACCUMULATED_MODELS = {
    "deepspeech": "",
    "transducer": (
        "model:\n  objective: transducer\n"
        "  transducer: {predictor_dim: 16, predictor_groups: 4, joint_dim: 24}\n"
    ),
}


def _weights_at_start(config) -> dict[str, np.ndarray]:
    from pipeline.model import build_model

    train = read_cache(Layout(config).features_cache("train"), config.features)
    model = build_model(config.model, train.n_input, load_alphabet(Layout(config).alphabet).n_classes)
    return _weights(model)


def test_a_stop_inside_a_window_saves_at_its_end_and_resumes_exactly(small_config, tmp_path):
    """A hook stops training after step 5, inside the window of steps 5 and 6: the trainer runs step 6,
    saves there (never inside the window) and stops; the resumed run ends with the weights of a run never
    stopped."""
    extra = (
        "training:\n  epochs: 2\n  batch_size: 2\n  accumulate_batches: 2\n  validation_epochs: 0\n"
        "  checkpoint_secs: 100000\n"
    )
    config = load_config(small_config(limit_train=16, extra=extra))
    build_features(config, ("train",))
    seen = []

    def stop_at_5(info):
        seen.append(info.step)
        if info.step == 5:
            raise StopTraining("asked")

    run_dir = tmp_path / "stopped"
    with pytest.raises(StopTraining, match="asked"):
        _fit(config, run_dir, TrainHooks(on_step=stop_at_5))
    assert seen == [1, 2, 3, 4, 5, 6]
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    assert saved == ["ckpt-6.index"], saved
    resumed_trainer, resumed = _fit(config, run_dir)
    assert (resumed.global_step, resumed.updates) == (16, 8)
    clean_trainer, clean = _fit(config, tmp_path / "clean")
    assert resumed.weights_sha256 == clean.weights_sha256


@pytest.mark.parametrize(
    "schedule", ["  lr_decay: noam\n  warmup_steps: 3\n", "  lr_decay: cosine\n  warmup_steps: 2\n"]
)
def test_a_schedule_resumes_where_it_was_across_its_warm_up_and_decay(schedule, small_config, tmp_path):
    """noam and cosine over 8 updates of 2 batches: a run stopped after update 3 (past the warm-up, into
    the decay) has the rate of update 3 of an 8-update run, and resumes to the weights of a run never
    stopped."""
    from pipeline.train.policy import learning_rate

    extra = (
        "training:\n  epochs: 2\n  batch_size: 2\n  accumulate_batches: 2\n  validation_epochs: 0\n"
        "  checkpoint_secs: 100000\n  learning_rate: 0.003\n" + schedule
    )
    config = load_config(small_config(limit_train=16, extra=extra))
    build_features(config, ("train",))

    def stop_at_5(info):
        if info.step == 5:
            raise StopTraining("asked")

    layout, run_dir = Layout(config), tmp_path / "stopped"
    train = read_cache(layout.features_cache("train"), config.features)
    stopped = Trainer(
        config,
        run_dir,
        [TaskData.only(train, None, load_alphabet(layout.alphabet))],
        make_strategy(config.distribution),
        hooks=TrainHooks(on_step=stop_at_5),
    )
    with pytest.raises(StopTraining, match="asked"):
        stopped.fit()
    assert int(stopped.state.updates.numpy()) == 3
    rate = learning_rate(config.training, 1.0, 3, 8)
    assert stopped._learning_rate() == pytest.approx(rate)
    assert rate < 0.003 * 0.95  # decaying already
    _, resumed = _fit(config, run_dir)
    _, clean = _fit(config, tmp_path / "clean")
    assert (resumed.updates, clean.updates) == (8, 8)
    assert resumed.weights_sha256 == clean.weights_sha256


def test_a_signal_inside_a_window_stops_at_its_end_and_the_log_says_when(small_config, tmp_path, caplog):
    """SIGTERM during step 5, inside the window of steps 5 and 6 (Train's signal handling, in this process):
    the log says the stop waits for the window's end, training stops after step 6 with its checkpoint, and
    the message names step 6."""
    extra = (
        "training:\n  epochs: 2\n  batch_size: 2\n  accumulate_batches: 2\n  validation_epochs: 0\n"
        "  checkpoint_secs: 100000\n"
    )
    config = load_config(small_config(limit_train=16, extra=extra))
    build_features(config, ("train",))
    stop = SignalStop(config.training.accumulate_batches)

    def on_step(info):
        if info.step == 5:
            signal.raise_signal(signal.SIGTERM)
        stop.check(info)

    run_dir = tmp_path / "signalled"
    with caplog.at_level(logging.WARNING), stop_on_signals(stop):
        with pytest.raises(StopTraining, match="stopped by SIGTERM after step 6; a checkpoint of that step"):
            _fit(config, run_dir, TrainHooks(on_step=on_step))
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.index")) == ["ckpt-6.index"]
    assert (
        "SIGTERM: training stops at the end of this update window (up to 1 more batch: "
        "training.accumulate_batches 2), with a checkpoint" in caplog.text
    )


_KILLABLE_TRAIN = """
import sys, logging
logging.basicConfig(level=logging.INFO)
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.stages.train import train_stage
report = train_stage(Layout(load_config(sys.argv[1])))
print("FINAL", report.global_step, report.updates)
"""


def test_sigkill_inside_a_window_resumes_from_the_window_before_to_the_same_weights(small_config, tmp_path):
    """checkpoint_steps 5 with windows of 2 batches: the save due after step 5 (inside the window of steps
    5 and 6) is made after step 6. Killed (SIGKILL) while paused after step 9, inside the window of steps 9
    and 10, the rerun restores step 6 and ends with the weights of a run never interrupted."""
    barrier = StepBarrier(tmp_path / "barrier", 9)
    extra = "training:\n  epochs: 2\n  batch_size: 2\n  accumulate_batches: 2\n  checkpoint_steps: 5\n"
    killed = small_config("killed.yaml", limit_train=24, extra=extra + barrier.config_yaml())
    config = load_config(killed)
    build_features(config, ("train", "dev"))
    script = tmp_path / "train.py"
    script.write_text(_KILLABLE_TRAIN)
    checkpoints = Layout(config).train_run.checkpoints
    process = subprocess.Popen(
        [sys.executable, str(script), str(killed)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=barrier.env(),
    )
    try:
        paused = barrier.wait(9, lambda: process.poll() is None or process.stdout.read()[-3000:])
        assert list(paused) == [process.pid] and paused[process.pid] == 9
        saved = sorted(int(p.name[5:-6]) for p in checkpoints.glob("ckpt-*.index"))
        assert saved == [6], saved
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.communicate()
    barrier.release(9)
    result = subprocess.run(
        [sys.executable, str(script), str(killed)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=barrier.env(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    restored = [line for line in result.stderr.splitlines() if "Restored" in line]
    assert restored and " step 6 " in restored[0], restored
    assert "FINAL 24 12" in result.stdout  # 2 epochs x 12 batches, 6 updates each
    report = read_report(Layout(config).train_run.report, TrainReport)
    clean = load_config(
        small_config(
            "clean.yaml", limit_train=24, extra=extra + f"paths:\n  work_dir: {tmp_path / 'clean'}\n"
        )
    )
    build_features(clean, ("train", "dev"))
    assert train_stage(Layout(clean)).weights_sha256 == report.weights_sha256


def test_two_towers_accumulating_two_batches_of_8_make_the_update_of_one_batch_of_16(small_config, tmp_path):
    """Two towers (logical CPU devices) of 4 utterances, 2 batches per update: the weights of one device
    at batch 16 (each tower's gradients are summed over its batches, then over the towers, once per
    update)."""
    common = "training:\n  epochs: 2\n  validation_epochs: 0\n  learning_rate: 0.003\n"
    one = small_config(
        "one.yaml", limit_train=32, extra=common + "  batch_size: 16\ndistribution:\n  strategy: one_device\n"
    )
    two = small_config(
        "two.yaml",
        limit_train=32,
        extra=common
        + "  global_batch_size: 8\n  accumulate_batches: 2\ndistribution:\n  strategy: mirrored\n"
        "  cpu_devices: 2\n",
    )
    build_features(load_config(one), ("train", "dev"))
    runs, difference, _ = compare_runs(one, two)
    assert runs == [(1, 4, 4), (2, 8, 4)], runs
    # Float rounding (test_trainer's two-tower test measures the same order); a wrong reduction is ~1e-3 off.
    assert difference < 5e-5, difference


def test_a_non_finite_batch_inside_a_window_is_skipped_and_the_window_still_updates(small_config, tmp_path):
    """One utterance with NaN features, windows of 2 batches of 1: its batch is logged and reported as
    skipped, the other batch of its window still makes the update, every weight stays finite."""
    extra = "training:\n  epochs: 1\n  batch_size: 1\n  accumulate_batches: 2\n  validation_epochs: 0\n"
    config = load_config(small_config(limit_train=8, extra=extra))
    build_features(config, ("train",))
    cache = Layout(config).features_cache("train")
    train = read_cache(cache, config.features)
    poisoned = int(np.argmax(train.lengths))
    copy = tmp_path / "poisoned.h5"
    shutil.copyfile(cache, copy)
    with h5py.File(copy, "r+") as h5:
        h5["features"][train.offsets[poisoned] : train.offsets[poisoned] + 5] = np.nan
    train = read_cache(copy, config.features)
    trainer = Trainer(
        config,
        tmp_path / "run",
        [TaskData.only(train, None, load_alphabet(Layout(config).alphabet))],
        make_strategy(config.distribution),
    )
    report = trainer.fit()
    assert [b["files"] for b in report.skipped_batches] == [[train.paths[poisoned]]]
    assert (report.global_step, report.updates) == (8, 4)
    assert int(trainer.optimizer.iterations.numpy()) == 4  # the poisoned batch's window updated too
    assert np.isfinite(report.train_losses[0]["train_loss"])
    assert all(np.all(np.isfinite(w.numpy())) for w in trainer.model.weights)
