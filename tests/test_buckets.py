"""training.bucket_growth: batches padded to a fixed grid of shapes, few shapes an epoch, one XLA compile a
shape, and no result changed by the padding."""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from native_client.alphabet import load_alphabet
from pipeline.batches.buckets import QUANTUM, ShapeGrid, frame_grid, shape_grid
from pipeline.batches.dataset import SplitReader, batch_plan, eval_dataset, train_dataset
from pipeline.config import TrainingConfig
from pipeline.config_loader import config_from_dict, load_config
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from pipeline.model import build_model
from pipeline.model.heads import OneTask
from pipeline.train.distribute import make_strategy
from pipeline.train.hooks import StopTraining, TrainHooks
from pipeline.train.loop import Trainer
from pipeline.train.step import task_gradients
from pipeline.train.tasks import TaskData
from tests.conftest import ROOT, build_features


def _train_split(config):
    """The config's cached training split (built if missing)."""
    build_features(config, ("train",))
    layout = Layout(config)
    return read_cache(layout.features_cache("train"), config.features)


def _shapes(dataset) -> set[tuple]:
    """The distinct (batch, frames, label width) shapes of a dataset's batches."""
    return {(*features.shape[:2], labels.shape[1]) for features, _, labels, _, _ in dataset}


def test_the_grid_grows_by_at_most_its_factor_in_multiples_of_8():
    grid = frame_grid(3000, 1.1)
    assert grid[0] == QUANTUM and grid[-1] >= 3000 and grid[-2] < 3000
    assert (grid % QUANTUM == 0).all() and (np.diff(grid) >= QUANTUM).all()
    # a step is the growth rounded down to 8, or 8 where that is more
    assert all(b <= max(a + QUANTUM, a * 1.1) for a, b in zip(grid[:-1], grid[1:], strict=True))
    assert len(grid) < 60  # 8 frames to 30 s of 10 ms frames
    # label widths: per grid value the widest label of any utterance at most that long, rounded up to 8
    grid = ShapeGrid(np.array([10, 20, 30, 100]), np.array([3, 17, 9, 30]), 1.5)
    assert [grid.frames(n) for n in (10, 16, 17, 30, 100)] == [16, 16, 24, 32, 104]
    assert [grid.labels(n) for n in (10, 20, 30, 100)] == [8, 24, 24, 32]
    with pytest.raises(ValueError, match="longer than the split"):
        grid.frames(105)


@pytest.fixture(scope="module")
def sample_train(tmp_path_factory):
    """configs/sample.yaml's whole training split (its 0.9x and 1.1x copies included) as cached."""
    work = tmp_path_factory.mktemp("sample")
    config = load_config(ROOT / "configs" / "sample.yaml", {"paths": {"work_dir": str(work)}})
    return config, _train_split(config)


def test_an_epoch_of_the_samples_training_split_has_at_most_64_shapes(sample_train):
    """One epoch of the sample's training split at its batch size: without the grid every batch is a shape
    of its own, with it (1.1) at most 64, also with a frame cap and two towers (partial batches included);
    padding is zeros beyond each utterance's frames and label."""
    config, index = sample_train
    batch = config.training.batch_size
    plain = _shapes(
        train_dataset(SplitReader(index), batch_plan(index.lengths, batch, 1), 1, 0, 1, 0, 0, 1, 7)
    )
    grid = shape_grid(index, 1.1)
    reader = SplitReader(index, grid)
    plan = batch_plan(index.lengths, batch, 1, grid=grid)
    bucketed = _shapes(train_dataset(reader, plan, 1, 0, 1, 0, 0, 1, 7))
    assert len(plain) == len(plan) == 142 and len(bucketed) == 22, (len(plain), len(bucketed))  # docs
    assert {size for size, _, _ in bucketed} == {batch}
    capped = batch_plan(index.lengths, 2 * batch, 2, max_batch_frames=1500, grid=grid)
    towers = _shapes(train_dataset(reader, capped, 2, 0, 2, 0, 0, 1, 7))
    assert len(towers) <= 64 and len({size for size, _, _ in towers}) > 1, towers
    assert all(size * frames <= 1500 or size == 1 for size, frames, _ in towers)
    for features, lengths, labels, label_lengths, _ in eval_dataset(reader, 16):
        frames = np.arange(features.shape[1])[None, :] >= lengths.numpy()[:, None]
        assert not features.numpy()[frames].any()
        beyond = np.arange(labels.shape[1])[None, :] >= label_lengths.numpy()[:, None]
        assert not labels.numpy()[beyond].any() and features.shape[1] in grid.grid


def _model(family: str):
    """A tiny model of ``family`` without dropout, for 26 MFCC-like inputs and 29 classes."""
    if family == "deepspeech":
        settings = {"deepspeech": {"n_hidden": 32, "dropout_rate": 0.0}}
    else:
        settings = {
            "architecture": "conformer",
            "conformer": {"d_model": 32, "heads": 2, "layers": 2, "conv_kernel": 5, "subsampling_channels": 8}
            | {"subsampling": 2, "dropout": 0.0, "attention_dropout": 0.0},
        }
    return build_model(config_from_dict({"model": settings}).model, 26, 29)


# Under XLA (compiling both families' steps, about 20 s) in make test-long: make test is near its budget.
@pytest.mark.parametrize(
    "jit", [False, pytest.param(True, marks=pytest.mark.long)], ids=["kernel-ctc", "xla"]
)
@pytest.mark.parametrize("family", ["deepspeech", "conformer"])
def test_padding_to_the_grid_changes_no_loss_logit_or_gradient(family, jit, small_config):
    """The same utterances padded to their longest and to a coarse grid (frames and labels): the same
    losses, gradients and valid logits, with TensorFlow's CTC kernel and in one XLA cluster."""
    index = _train_split(load_config(small_config(limit_train=12)))
    grid = ShapeGrid(index.lengths, np.array([len(label) for label in index.labels]), 1.6)
    widths = np.array([len(label) for label in index.labels])
    first = next(  # 6 utterances whose frames and labels both pad
        i
        for i in range(len(index) - 5)
        if grid.frames(index.lengths[i + 5]) > index.lengths[i + 5]
        and grid.labels(index.lengths[i + 5]) > widths[i : i + 6].max()
    )
    batch = tf.constant(np.arange(first, first + 6, dtype=np.int32))
    tight, padded = SplitReader(index).gather(batch), SplitReader(index, grid).gather(batch)
    assert padded[0].shape[1] > tight[0].shape[1] and padded[2].shape[1] > tight[2].shape[1]
    model = OneTask(_model(family))
    step = task_gradients(model, (0,), [28], keras.optimizers.Adam(), TrainingConfig(jit_compile=jit))
    draws = getattr(model.model, "chunk_seed", None)  # the Conformer's chunk draws: the same for both
    start = draws.state.numpy() if draws is not None else None
    results = []
    for inputs in (tight, padded):
        if draws is not None:
            draws.state.assign(start)
        sums, _, _, grads = step((inputs,), tf.constant([1.0]))
        logits, lengths = model.forward(0, inputs[0], inputs[1], training=False)
        results.append((sums[0].numpy(), [g.numpy() for g in grads], logits.numpy(), lengths.numpy()))
    (loss, grads, logits, lengths), (loss2, grads2, logits2, lengths2) = results
    np.testing.assert_allclose(loss2, loss, rtol=1e-5)
    for g, g2 in zip(grads, grads2, strict=True):
        # A weight's gradient sums over every frame, the padding's zeros included: in another order, so
        # equal to float32 rounding of the largest terms (a leak of the padding would be of their size).
        np.testing.assert_allclose(g2, g, rtol=1e-4, atol=2e-5 * np.abs(g).max())
    np.testing.assert_array_equal(lengths2, lengths)
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(logits2[row, :length], logits[row, :length], rtol=1e-5, atol=1e-5)


@pytest.mark.long
def test_a_jit_compiled_epoch_compiles_the_step_once_per_shape(small_config, tmp_path):
    """training.jit_compile with the grid: XLA's own dump holds one compiled step per distinct shape of the
    epoch, fewer than its batches' shapes without the grid. Run in a process of its own (XLA reads its
    flags once)."""
    extra = "training:\n  epochs: 1\n  validation_epochs: 0\n  jit_compile: true\n  bucket_growth: 1.5\n"
    path = small_config(limit_train=48, extra=extra)
    config = load_config(path)
    index = _train_split(config)
    build_features(config, ("dev",))  # Train reads its dev split
    dump = tmp_path / "xla"
    script = (
        "import sys\nfrom pipeline.config_loader import load_config\nfrom pipeline.layout import Layout\n"
        "from pipeline.stages.train import train_stage\ntrain_stage(Layout(load_config(sys.argv[1])))\n"
    )
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, env=env, cwd=ROOT, timeout=600)
    # One device: the whole step is the compiled function (pipeline.train.step.compiles_the_update).
    compiled = {p.name.split(".")[0] for p in dump.glob("*replica_step*.before_optimizations.txt")}
    grid = shape_grid(index, 1.5)
    plan = batch_plan(index.lengths, 4, 1, grid=grid)
    longest = [int(index.lengths[b].max()) for b in plan]
    bucketed = {(len(b), grid.frames(n), grid.labels(n)) for b, n in zip(plan, longest, strict=True)}
    plain = {(len(b), n, max(len(index.labels[i]) for i in b)) for b, n in zip(plan, longest, strict=True)}
    assert len(compiled) == len(bucketed) < len(plain), (len(compiled), len(bucketed), len(plain))


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.long)])
def test_a_bucketed_run_stopped_mid_epoch_resumes_to_the_weights_of_one_never_stopped(
    small_config, tmp_path, jit
):
    """With the grid and a frame cap counting its padded frames, a run stopped at step 5 of its first epoch
    resumes where it was and ends with the weights of a run never stopped; also with the whole step
    compiled by XLA (``jit_compile`` on one device: the grid is what a GPU run would use)."""
    extra = (
        "training:\n  epochs: 2\n  validation_epochs: 0\n  checkpoint_secs: 100000\n"
        f"  bucket_growth: 1.2\n  max_batch_frames: 400\n  jit_compile: {str(jit).lower()}\n"
    )
    config = load_config(small_config(limit_train=16, extra=extra))
    train = _train_split(config)
    alphabet = load_alphabet(Layout(config).alphabet)

    def fit(run_dir, hooks=None):
        strategy = make_strategy(config.distribution)
        return Trainer(config, run_dir, [TaskData.only(train, None, alphabet)], strategy, hooks=hooks).fit()

    def stop_at_5(info):
        if info.step == 5:
            raise StopTraining("asked")

    with pytest.raises(StopTraining, match="asked"):
        fit(tmp_path / "stopped", TrainHooks(on_step=stop_at_5))
    resumed, clean = fit(tmp_path / "stopped"), fit(tmp_path / "clean")
    assert resumed.global_step == clean.global_step > 8  # the cap cut batches of 4 into smaller steps
    assert resumed.weights_sha256 == clean.weights_sha256
