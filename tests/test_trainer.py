"""Training for real on small slices of the sample corpus."""

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import tensorflow as tf

from native_client.alphabet import load_alphabet
from pipeline.config_loader import load_config
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from pipeline.model import build_model, model_family
from pipeline.model.checkpoints import CheckpointMismatchError
from pipeline.model.deepspeech_net import make_windows
from pipeline.model.weights import named_weights
from pipeline.reports import TrainReport, read_report
from pipeline.stages.evaluate import evaluate_stage
from pipeline.stages.train import train_stage
from pipeline.train.determinism import ops_are_deterministic
from pipeline.train.distribute import make_strategy
from pipeline.train.loop import Trainer, TrainingError
from pipeline.train.tasks import TaskData, global_batch_size
from tests.conftest import ROOT, build_features
from tests.plugins.step_barrier import StepBarrier
from tests.towers import compare_runs

# The tiny model of each built-in family (YAML lines), for the tests that must hold for every family.
FAMILY_MODELS = {
    "deepspeech": "",
    "conformer": (
        "model:\n  architecture: conformer\n  conformer: {d_model: 32, heads: 2, layers: 2, conv_kernel: 5, "
        "subsampling: 2, subsampling_channels: 8, dropout: 0.0, attention_dropout: 0.0}\n"
    ),
}
# the Conformer trained as a transducer: its predictor and joiner are weights of the step like any other
FAMILY_MODELS["transducer"] = (
    FAMILY_MODELS["conformer"]
    + "  objective: transducer\n  transducer: {predictor_dim: 16, predictor_groups: 4, joint_dim: 24}\n"
)


def _trainer(config, run_dir, train=None):
    alphabet = load_alphabet(Layout(config).alphabet)
    train = train or read_cache(Layout(config).features_cache("train"), config.features)
    dev = read_cache(Layout(config).features_cache("dev"), config.features)
    return Trainer(config, run_dir, [TaskData.only(train, dev, alphabet)], make_strategy(config.distribution))


def test_loss_falls_and_report_is_complete(small_config, tmp_path):
    config = load_config(
        small_config(limit_train=16, extra="training:\n  epochs: 4\n  learning_rate: 0.003\n")
    )
    build_features(config)
    report = train_stage(Layout(config))
    losses = [e["train_loss"] for e in report.train_losses]
    assert (
        len(losses) == 4
        and all(b < a for a, b in zip(losses, losses[1:], strict=False))
        and losses[-1] < 0.9 * losses[0]
    )
    assert report.global_step == 16 and report.epochs_completed == 4
    assert report.stop.rule is None and "target of 4 epochs" in report.stop.reason
    run_dir = Layout(config).train_run.root
    assert json.loads((run_dir / "train_report.json").read_text())["global_step"] == 16
    assert (run_dir / "config.yaml").exists() and list((run_dir / "best").glob("best-*.index"))
    assert list((run_dir / "summaries" / "train").iterdir())
    evaluation = evaluate_stage(Layout(config), tmp_path / "eval")
    assert {"wer", "cer", "loss", "samples"} <= set(vars(evaluation))
    assert json.loads((tmp_path / "eval" / "evaluation.json").read_text())["samples_count"] == 8


@pytest.mark.long
@pytest.mark.slow
def test_five_utterances_are_learned(small_config):
    config = load_config(
        small_config(
            limit_train=5,
            n_hidden=128,
            extra=textwrap.dedent("""
        data:
          dev_files: [../data/sample/train.csv]
          limit_dev: 5
        training:
          epochs: 250
          batch_size: 5
          learning_rate: 0.003
          validation_epochs: 50
    """).replace("../data", str(ROOT / "data")),
        )
    )
    build_features(config, ("train", "dev"))
    report = train_stage(Layout(config))
    assert report.validations[-1]["cer"] < 0.1, report.validations


def test_global_batch_must_split_over_towers(small_config):
    config = load_config(small_config(extra="training:\n  global_batch_size: 5\n"))
    with pytest.raises(TrainingError, match="global_batch_size 5 does not split over 2 towers"):
        global_batch_size(config, 2)
    assert global_batch_size(config, 1) == (5, 5)
    config = load_config(small_config(extra="training:\n  global_batch_size: 6\n"))
    assert global_batch_size(config, 2) == (3, 6)


@pytest.mark.parametrize(
    "family, weights",
    [
        # the family's weights and the normalisation's mean and std (the sample normalises globally)
        pytest.param("deepspeech", 15, marks=pytest.mark.long),
        pytest.param("conformer", 68, marks=pytest.mark.long),
        # and the transducer's embedding, grouped kernel, predictor projection and joiner output
        pytest.param("transducer", 74, marks=pytest.mark.long),
    ],
)
def test_two_towers_give_the_same_update_as_one_device(small_config, tmp_path, family, weights):
    # Two steps: the Conformer's first chunk draw is full context, its second a chunk (which the towers
    # drew from their own longest utterances). Adam's epsilon 1e-3: its first update, g / (|g| + eps), made
    # the rounding of a gradient that cancels to about 1e-6 (block_1.conv_in's, at the default eps 1e-8)
    # a difference of 0.3 times the learning rate; a gradient summed wrongly still shows.
    common = "training:\n  epochs: 1\n  global_batch_size: 4\n  epsilon: 0.001\n" + FAMILY_MODELS[family]
    one = small_config("one.yaml", limit_train=8, extra=common + "distribution:\n  strategy: one_device\n")
    two = small_config(
        "two.yaml", limit_train=8, extra=common + "distribution:\n  strategy: mirrored\n  cpu_devices: 2\n"
    )
    config_one, config_two = load_config(one), load_config(two)
    assert Layout(config_one).train_run.root != Layout(config_two).train_run.root
    build_features(config_one)
    runs, diff, count = compare_runs(one, two, timeout=300)
    assert [towers for towers, _, _ in runs] == [1, 2], runs
    line = f"MAXDIFF {diff} {count}"
    assert count == weights
    # Float rounding only: two towers sum each weight's gradient in another order (the fused LSTM's weight
    # gradients are one product over all frames of a tower). A wrong reduction differs by a good part of
    # the learning rate.
    assert diff < 5e-5, line


_COUNT_REDUCTIONS = """
import sys
import tensorflow as tf
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.stages.train import train_stage
from pipeline.train.distribute import configure_devices

config = load_config(sys.argv[1])
configure_devices(config.distribution)
sizes = []
all_reduce = tf.distribute.ReplicaContext.all_reduce

def counted(self, op, value, options=None):
    sizes.append(len(tf.nest.flatten(value)))
    return all_reduce(self, op, value, options)

tf.distribute.ReplicaContext.all_reduce = counted
report = train_stage(Layout(config))
print("REDUCTIONS", report.towers, report.updates, *sizes)
"""


@pytest.mark.parametrize("accumulate", [1, 2])
def test_each_update_all_reduces_the_gradient_once(small_config, accumulate):
    """Two towers: the traced step sums the gradient over the towers once (with the loss and the vote),
    and Keras' optimizer does not sum it again (it would double the traffic of every update)."""
    extra = (
        f"training:\n  epochs: 1\n  global_batch_size: 4\n  validation_epochs: 0\n"
        f"  accumulate_batches: {accumulate}\ndistribution:\n  strategy: mirrored\n  cpu_devices: 2\n"
    )
    config = load_config(small_config(limit_train=8, extra=extra))
    build_features(config, ("train", "dev"))
    result = subprocess.run(
        [sys.executable, "-c", _COUNT_REDUCTIONS, str(config.source)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    line = next((ln.split()[1:] for ln in result.stdout.splitlines() if ln.startswith("REDUCTIONS")), None)
    assert line, result.stderr[-3000:]
    towers, updates, *sizes = map(int, line)
    assert (towers, updates) == (2, 2 // accumulate)
    weights = 13  # DeepSpeech's: each all-reduce of the gradient carries all of them
    carrying_gradients = [size for size in sizes if size >= weights]
    # once per tower in the one traced update (a plain step: the gradient, the loss and the vote)
    assert carrying_gradients == [weights + 2 if accumulate == 1 else weights] * towers, sizes


_KILLABLE_TRAIN = """
import sys, logging
logging.basicConfig(level=logging.INFO)
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.stages.train import train_stage
if __name__ == "__main__":
    report = train_stage(Layout(load_config(sys.argv[1])))
    print("FINAL_STEP", report.global_step)
"""


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=pytest.mark.long) if f != "deepspeech" else f for f in FAMILY_MODELS]
)
def test_sigkill_mid_epoch_resumes_from_checkpoint(small_config, tmp_path, family):
    """Killed (SIGKILL) while paused after step 7 of 20, two steps after the save after step 5: the
    rerun restores step 5 and ends with the weights of a run never interrupted."""
    barrier = StepBarrier(tmp_path / "barrier", 7)
    extra = FAMILY_MODELS[family] + "training:\n  epochs: 2\n  checkpoint_steps: 5\n  batch_size: 2\n"
    killed = small_config("killed.yaml", limit_train=40, extra=extra + barrier.config_yaml())
    config = load_config(killed)
    build_features(config)
    script = tmp_path / "train.py"
    script.write_text(_KILLABLE_TRAIN)
    checkpoints = Layout(config).train_run.root / "checkpoints"
    process = subprocess.Popen(
        [sys.executable, str(script), str(killed)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=barrier.env(),
    )
    try:
        paused = barrier.wait(7, lambda: process.poll() is None or process.stdout.read()[-3000:])
        assert list(paused) == [process.pid] and paused[process.pid] == 7
        latest = tf.train.latest_checkpoint(str(checkpoints))
        assert latest and latest.endswith("ckpt-5"), latest
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.communicate()
    assert not (Layout(config).train_run.root / "train_report.json").exists()

    barrier.release(7)  # the rerun passes step 7 again
    result = subprocess.run(
        [sys.executable, str(script), str(killed)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=barrier.env(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    restored = [log_line for log_line in result.stderr.splitlines() if "Restored" in log_line]
    assert restored and " step 5 " in restored[0], restored
    assert "FINAL_STEP 40" in result.stdout  # 2 epochs x 20 steps, as an uninterrupted run
    report = read_report(Layout(config).train_run.report, TrainReport)
    assert report.global_step == 40 and report.epochs_completed == 2
    # Exact resume: the same weights, bit for bit, as a run that was never interrupted.
    clean = load_config(
        small_config(
            "clean.yaml", limit_train=40, extra=extra + f"paths:\n  work_dir: {tmp_path / 'clean'}\n"
        )
    )
    build_features(clean)
    clean_report = train_stage(Layout(clean))
    assert clean_report.weights_sha256 == report.weights_sha256
    # training.deterministic: auto: both runs trained with op determinism on (no GPU), off again after.
    assert report.deterministic_ops and clean_report.deterministic_ops and not ops_are_deterministic()


def test_checkpoint_steps_saves_at_known_steps_and_hooks_of_ones_own_run(small_config, tmp_path):
    """training.checkpoint_steps saves after every 3rd step (and at epoch ends), whatever the clock; a
    module named in training.hooks sees every step (the step barrier, with no step to pause at)."""
    extra = (
        "training:\n  epochs: 2\n  checkpoint_secs: 100000\n  checkpoint_steps: 3\n  max_to_keep: 100\n"
        + StepBarrier.config_yaml()
    )
    config = load_config(small_config("steps.yaml", limit_train=16, extra=extra))
    build_features(config, ("train", "dev"))
    report = train_stage(Layout(config))
    assert report.global_step == 8  # 2 epochs of 4 steps
    saved = {int(p.name[5:-6]) for p in Layout(config).train_run.checkpoints.glob("ckpt-*.index")}
    assert saved == {3, 4, 6, 8}, sorted(saved)


def test_a_training_hook_that_is_not_a_module_is_named_in_one_line(small_config):
    from native_client.plugins import PluginError

    extra = "training:\n  epochs: 1\n  hooks: [tests.plugins.no_such_hooks]\n"
    config = load_config(small_config("nohook.yaml", limit_train=4, extra=extra))
    build_features(config, ("train", "dev"))
    with pytest.raises(PluginError) as error:
        train_stage(Layout(config))
    assert "training.hooks: no module 'tests.plugins.no_such_hooks'" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.long
@pytest.mark.parametrize("hook", ["validation", "epoch"])
def test_a_stop_from_an_epoch_end_hook_is_saved_and_a_rerun_goes_on_from_there(
    small_config, monkeypatch, hook
):
    """Issue 42 G8: a StopTraining raised by an on_validation or on_epoch hook (a plug-in of training.hooks)
    left the epoch unsaved: a rerun trained it again and met the same stop, for ever. It is now carried out
    after the epoch's checkpoint, as a stop from on_step is after its step's: the rerun, with the same hook,
    goes on from the next epoch and finishes."""
    from pipeline.train.hooks import StopTraining

    monkeypatch.setenv("EPOCH_END_STOP", f"{hook}:1")
    extra = (
        "training:\n  epochs: 3\n  checkpoint_secs: 100000\n  max_to_keep: 100\n"
        "  hooks: [tests.plugins.epoch_end_stop]\n"
    )
    config = load_config(small_config("epoch_end.yaml", limit_train=8, extra=extra))
    build_features(config, ("train", "dev"))
    run = Layout(config).train_run
    with pytest.raises(StopTraining, match=f"the {hook} hook stops training after epoch 1"):
        train_stage(Layout(config))
    assert sorted(p.name for p in run.checkpoints.glob("ckpt-*.index")) == ["ckpt-2.index"]  # epoch 1's end
    assert not run.report.exists()
    report = train_stage(Layout(config))
    assert (report.epochs_completed, report.global_step) == (3, 6)  # 3 epochs of 2 steps, none twice
    assert [loss["epoch"] for loss in report.train_losses] == [1, 2, 3]
    assert [validation["epoch"] for validation in report.validations] == [1, 2, 3]


def test_changed_geometry_names_directory_and_variables(small_config):
    config = load_config(small_config(limit_train=4, n_hidden=16, extra="training:\n  epochs: 1\n"))
    build_features(config)
    run_dir = Layout(config).train_run.root
    train_stage(Layout(config))
    wider = load_config(
        small_config("wide.yaml", limit_train=4, n_hidden=24, extra="training:\n  epochs: 1\n")
    )
    trainer = _trainer(wider, run_dir)
    with pytest.raises(CheckpointMismatchError) as error:
        trainer.restore()
    message = str(error.value)
    assert str(run_dir / "checkpoints") in message
    assert "layer_1.kernel: checkpoint [494, 16] vs model [494, 24]" in message
    assert "lstm.lstm_cell.recurrent_kernel" in message


def _poisoned(cache, config, copy, start: int, stop: int):
    """A copy of a feature cache with NaN in frames [start, stop), read back as an index."""
    shutil.copyfile(cache, copy)
    with h5py.File(copy, "r+") as h5:
        h5["features"][start:stop] = np.nan
    return read_cache(copy, config.features)


def test_non_finite_batches_are_skipped_and_logged(small_config, caplog, tmp_path):
    config = load_config(
        small_config(limit_train=8, extra="training:\n  epochs: 1\n  batch_size: 1\n  validation_epochs: 0\n")
    )
    build_features(config)
    cache = Layout(config).features_cache("train")
    train = read_cache(cache, config.features)
    poisoned = int(np.argmax(train.lengths))
    train = _poisoned(
        cache, config, tmp_path / "poisoned.h5", train.offsets[poisoned], train.offsets[poisoned] + 5
    )
    trainer = _trainer(config, Layout(config).train_run.root, train)
    report = trainer.fit()
    assert len(report.skipped_batches) == 1
    assert report.skipped_batches[0]["files"] == [train.paths[poisoned]]
    assert report.global_step == 8
    assert any(train.paths[poisoned] in r.message for r in caplog.records)
    for weight in trainer.model.weights:
        assert np.all(np.isfinite(weight.numpy()))

    train = _poisoned(cache, config, tmp_path / "all-nan.h5", 0, int(train.lengths.sum()))
    config = load_config(
        small_config(
            "bad.yaml",
            limit_train=8,
            extra=(
                "training:\n  epochs: 1\n  batch_size: 1\n  max_nonfinite_batches: 3\n"
                "  validation_epochs: 0\n  shuffle_seed: 5\n"
            ),
        )
    )
    trainer = _trainer(config, Layout(config).work_dir / "all-bad", train)
    with pytest.raises(TrainingError, match="3 batches in a row had a non-finite loss"):
        trainer.fit()


def test_a_nan_validation_never_becomes_the_best(small_config, tmp_path):
    """Issue 26 L2: a NaN first dev loss was reported as ``best_dev`` (and stayed so after finite ones)."""
    config = load_config(small_config(limit_train=8, extra="training:\n  epochs: 1\n"))
    build_features(config, ("train", "dev"))
    layout = Layout(config)
    dev = read_cache(layout.features_cache("dev"), config.features)
    nan_dev = _poisoned(
        layout.features_cache("dev"), config, tmp_path / "nan-dev.h5", 0, int(dev.lengths.sum())
    )
    train = read_cache(layout.features_cache("train"), config.features)
    alphabet, strategy = load_alphabet(layout.alphabet), make_strategy(config.distribution)
    run_dir = tmp_path / "run"
    first = Trainer(config, run_dir, [TaskData.only(train, nan_dev, alphabet)], strategy).fit()
    assert math.isnan(first.validations[0]["dev_loss"])
    assert first.best_dev is None
    assert first.best_checkpoint.endswith(f"best-{first.global_step}")  # the last stands in for the best
    two = dataclasses.replace(config, training=dataclasses.replace(config.training, epochs=2))
    second = Trainer(two, run_dir, [TaskData.only(train, dev, alphabet)], strategy).fit()
    assert [math.isnan(v["dev_loss"]) for v in second.validations] == [True, False]
    assert second.best_dev is not None and second.best_dev.epoch == 2
    assert second.best_checkpoint.endswith(f"best-{second.global_step}")


def test_streaming_and_full_sequence_logits_agree(small_config):
    config = load_config(small_config(n_hidden=24))
    model = build_model(config.model, 26, 29)
    features = tf.random.stateless_normal([1, 53, 26], seed=[1, 2])
    full = model(features).numpy()
    # the streaming form runs the same layers, n_steps at a time with the state carried
    windows = make_windows(tf.pad(features, [[0, 0], [0, 11], [0, 0]]), config.model.options.n_context)
    family = model_family(config.model.architecture)
    form = family.streaming(model, 16)
    state = [tf.zeros(s.shape) for s in family.state(config.model)]
    chunks = []
    for start in range(0, 64, 16):
        logits, *state = form.step(windows[:, start : start + 16], *state)
        chunks.append(logits.numpy())
    np.testing.assert_allclose(np.concatenate(chunks, axis=1)[:, :53], full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        form.utterance(make_windows(features, config.model.options.n_context)).numpy(),
        full,
        rtol=1e-5,
        atol=1e-5,
    )


def test_more_epochs_continue_the_same_run(small_config):
    config = load_config(
        small_config(limit_train=8, extra="training:\n  epochs: 1\n  validation_epochs: 0\n")
    )
    build_features(config)
    assert train_stage(Layout(config)).global_step == 2
    more = load_config(
        small_config("more.yaml", limit_train=8, extra="training:\n  epochs: -2\n  validation_epochs: 0\n")
    )
    assert Layout(more).train_run.root == Layout(config).train_run.root
    report = train_stage(Layout(more))
    assert report.epochs_completed == 3 and report.global_step == 6


def test_warm_start_copies_weights_and_can_drop_the_last_layers(small_config):
    config = load_config(small_config(limit_train=4, n_hidden=16, extra="training:\n  epochs: 1\n"))
    build_features(config)
    source = train_stage(Layout(config))
    reader = tf.train.load_checkpoint(source.best_checkpoint)
    warm = load_config(
        small_config(
            "warm.yaml",
            limit_train=4,
            n_hidden=16,
            extra=textwrap.dedent(f"""
        training:
          epochs: 1
          learning_rate: 0.000001
          init_from: {Layout(config).train_run.root}
          drop_source_layers: 1
        model:
          random_seed: 99
    """),
        )
    )
    assert Layout(warm).train_run.root != Layout(config).train_run.root
    trainer = _trainer(warm, Layout(warm).train_run.root)
    assert trainer.restore() == str(Layout(config).train_run.root)
    weights = {name: v.numpy() for name, v in named_weights(trainer.model).items()}
    np.testing.assert_array_equal(
        weights["layer_1.kernel"], reader.get_tensor("weights/layer_1..kernel/.ATTRIBUTES/VARIABLE_VALUE")
    )
    assert not np.allclose(
        weights["layer_6.kernel"], reader.get_tensor("weights/layer_6..kernel/.ATTRIBUTES/VARIABLE_VALUE")
    )
    assert int(trainer.optimizer.iterations.numpy()) == 0


def test_a_warm_start_from_a_checkpoint_changed_since_the_run_was_scheduled_is_one_line(
    small_config, monkeypatch
):
    """training.init_from is fingerprinted when the run is scheduled and checked again when Train reads it
    (issue 42, G10): a source run that trained on meanwhile is one line naming it, never its newer weights
    under the old fingerprint; scheduled again, the run starts from the checkpoint as it is now."""
    import pipeline.train.checkpointing as checkpointing
    from pipeline.model.checkpoints import InitFromChanged
    from pipeline.stages.train_launch import _worker_args

    # without validation every epoch's end is the run's best checkpoint, the one a warm start reads
    train = "training:\n  validation_epochs: 0\n  epochs: "
    source = load_config(small_config(limit_train=4, n_hidden=16, extra=train + "1\n"))
    build_features(source)
    train_stage(Layout(source))
    root = Layout(source).train_run.root
    warm_yaml = small_config(
        "warm.yaml", limit_train=4, n_hidden=16, extra=f"training:\n  epochs: 1\n  init_from: {root}\n"
    )
    scheduled = Layout(load_config(warm_yaml))
    fingerprint = scheduled.train_fingerprint  # scheduled: it holds the digest of the source's checkpoint now
    assert _worker_args(scheduled) == ("--init-digest", scheduled.init_from_digest)  # a worker is told it

    # the source run trains on (a higher epochs continues it in its directory) and saves new checkpoints
    more = load_config(small_config(limit_train=4, n_hidden=16, extra=train + "2\n"))
    assert Layout(more).train_run.root == root
    train_stage(Layout(more))
    with pytest.raises(InitFromChanged) as raised:
        train_stage(scheduled)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(
        f"training.init_from: {root} changed since this run was scheduled"
    )
    assert "run Train again" in message
    assert not list(scheduled.train_run.checkpoints.glob("ckpt-*"))  # nothing trained from the new weights
    # A worker given the scheduled digest trains under the scheduled fingerprint and refuses the same way.
    pinned = Layout(load_config(warm_yaml), init_from_digest=scheduled.init_from_digest)
    assert pinned.train_fingerprint == fingerprint

    again = Layout(load_config(warm_yaml))  # scheduled again: the checkpoint as it is now
    assert again.train_fingerprint != fingerprint
    real = checkpointing.warm_start
    index = next(root.glob("best/*.index"))
    saved = index.read_bytes()

    def read_then_changed(*args, **kwargs):  # the source's checkpoint changes while the warm start reads it
        copied = real(*args, **kwargs)
        index.write_bytes(saved + b"\0")
        return copied

    monkeypatch.setattr(checkpointing, "warm_start", read_then_changed)
    with pytest.raises(InitFromChanged, match="changed since this run was scheduled"):
        train_stage(again)
    monkeypatch.setattr(checkpointing, "warm_start", real)
    index.write_bytes(saved)
    assert train_stage(Layout(load_config(warm_yaml))).epochs_completed == 1


# Phases of a run moved between one tower and two (distribution.cpu_devices 1, then 2) in one process:
# argv: mode, then config paths. A run is "killed" mid-epoch by a hook after step 6; its configs save
# after step 5 (training.checkpoint_steps), never by the clock.
_MOVED = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
import numpy as np, tensorflow as tf
from pipeline.config import DistributionConfig
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.model.checkpoints import resolve_checkpoint
from pipeline.stages.train import train_stage
from pipeline.train.distribute import configure_devices
from pipeline.train.hooks import TrainHooks
from pipeline.train.loop import TrainingError

class Killed(Exception):
    pass

def on_step(info):
    if info.step == 6:
        raise Killed()

def weights(report):
    reader = tf.train.load_checkpoint(resolve_checkpoint(report.latest_checkpoint.rsplit("/", 1)[0]))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k.startswith("weights/")}

configure_devices(DistributionConfig(cpu_devices=2))  # before TensorFlow starts: the two-tower runs need it
for phase in sys.argv[1:]:
    if phase.startswith("kill:"):
        try:
            train_stage(Layout(load_config(phase[5:])), hooks=TrainHooks(on_step=on_step))
        except Killed:
            print(json.dumps({"phase": "killed"}), flush=True)
    elif phase.startswith("train:"):
        try:
            report = train_stage(Layout(load_config(phase[6:])))
        except TrainingError as error:
            print(json.dumps({"phase": "refused", "error": str(error)}), flush=True)
            continue
        w = weights(report)
        np.savez(phase[6:] + ".weights.npz", **{k.replace("/", "|"): v for k, v in w.items()})
        print(json.dumps({"phase": "trained", "towers": report.towers,
                          "global_batch": report.global_batch_size, "global_step": report.global_step,
                          "epochs": report.epochs_completed}), flush=True)
"""


def _moved(tmp_path, *phases) -> tuple[list[dict], str]:
    script = tmp_path / "moved.py"
    script.write_text(_MOVED)
    result = subprocess.run(
        [sys.executable, str(script), *phases], capture_output=True, text=True, cwd=ROOT, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")], result.stderr


@pytest.mark.long
@pytest.mark.slow
def test_a_run_moved_to_other_towers_mid_epoch_is_refused_and_continues_from_an_epoch_boundary(
    small_config, tmp_path
):
    """Issue 26 M4: one tower (global batch 2, 12 steps per epoch) killed mid-epoch, then two towers (global
    batch 4): refused in one line naming both; finished on one tower with epochs: -1; then two towers go on
    from the epoch boundary with a warning, on the new plan (6 steps per epoch)."""
    common = "training:\n  epochs: 2\n  batch_size: 2\n  checkpoint_steps: 5\n"
    one = small_config("one.yaml", limit_train=24, extra=common + "distribution:\n  cpu_devices: 1\n")
    two = small_config("two.yaml", limit_train=24, extra=common + "distribution:\n  cpu_devices: 2\n")
    finish = small_config(
        "finish.yaml",
        limit_train=24,
        extra=common.replace("epochs: 2", "epochs: -1") + "distribution:\n  cpu_devices: 1\n",
    )
    configs = [load_config(p) for p in (one, two, finish)]
    assert len({Layout(c).train_run.root for c in configs}) == 1  # cpu_devices is not in the fingerprint
    build_features(configs[0], ("train", "dev"))
    results, log = _moved(tmp_path, f"kill:{one}", f"train:{two}", f"train:{finish}", f"train:{two}")
    assert [r["phase"] for r in results] == ["killed", "refused", "trained", "trained"], results
    refusal = results[1]["error"]
    assert "\n" not in refusal and "at step 5 " in refusal, refusal  # the save after step 5
    assert "1 towers x 2 = global batch 2" in refusal and "2 towers x 2 = global batch 4" in refusal
    assert "training.epochs: -1" in refusal and "make rerun STAGE=Train" in refusal
    assert results[2] == {"phase": "trained", "towers": 1, "global_batch": 2, "global_step": 12, "epochs": 1}
    assert results[3] == {"phase": "trained", "towers": 2, "global_batch": 4, "global_step": 18, "epochs": 2}
    assert "resuming at the start of epoch 2 with 2 towers x 2 = global batch 4" in log


@pytest.mark.slow
@pytest.mark.long
def test_a_run_moved_to_other_towers_with_the_same_global_batch_resumes_exactly(small_config, tmp_path):
    """Issue 26 M4: with training.global_batch_size fixed the plan is the same on one tower and two, so a
    run killed mid-epoch on one resumes on two at the very next batch: it ends with the weights of a run
    never interrupted (to float32 summation order)."""
    common = "training:\n  epochs: 2\n  global_batch_size: 4\n  checkpoint_steps: 5\n"
    one = small_config("one.yaml", limit_train=32, extra=common + "distribution:\n  cpu_devices: 1\n")
    two = small_config("two.yaml", limit_train=32, extra=common + "distribution:\n  cpu_devices: 2\n")
    clean = small_config(
        "clean.yaml",
        limit_train=32,
        extra=common + f"distribution:\n  cpu_devices: 1\npaths:\n  work_dir: {tmp_path / 'clean'}\n",
    )
    build_features(load_config(one), ("train", "dev"))
    build_features(load_config(clean), ("train", "dev"))
    results, log = _moved(tmp_path, f"kill:{one}", f"train:{two}", f"train:{clean}")
    assert [r["phase"] for r in results] == ["killed", "trained", "trained"], results
    assert results[1]["towers"] == 2 and results[1]["global_step"] == results[2]["global_step"] == 16
    restored = [line for line in log.splitlines() if "Restored" in line]
    assert restored and " step 5 " in restored[0], restored
    moved, uninterrupted = np.load(f"{two}.weights.npz"), np.load(f"{clean}.weights.npz")
    assert len(moved.files) == 15  # DeepSpeech's 13 and the normalisation's mean and std
    # Measured 5e-5 apart after 24 such steps (float32 sums over one tower or two, through Adam);
    # batches out of place (another shuffle_seed: measured 0.048) move them far more.
    difference = max(float(np.max(np.abs(moved[k] - uninterrupted[k]))) for k in moved.files)
    assert difference < 2e-4, difference
