"""Mixed precision and the GPU rules: bfloat16 trains and resumes in float32, the export is float32,
the LSTM keeps the arguments of the cuDNN kernel."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.model import build_model
from tests.conftest import SAMPLE, build_features


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_the_lstm_keeps_the_cudnn_arguments_and_variables_stay_float32(small_config, precision):
    config = load_config(small_config())
    model = build_model(config.model, 26, 29, precision)
    lstm = model.lstm
    # What Keras requires to run an LSTM with cuDNN on a GPU.
    assert lstm.cell.activation is tf.keras.activations.tanh or lstm.cell.activation.__name__ == "tanh"
    assert lstm.cell.recurrent_activation.__name__ == "sigmoid"
    assert lstm.cell.recurrent_dropout == 0 and lstm.unroll is False and lstm.cell.use_bias is True
    assert {v.dtype for v in model.weights} == {"float32"}
    assert model(tf.zeros([1, 5, 26])).dtype == tf.float32  # logits (and so softmax and CTC) in float32


@pytest.mark.slow
def test_bfloat16_trains_resumes_in_float32_and_exports_float32_logits(small_config, caplog):
    import logging

    from native_client import Model
    from native_client.audio import load_for_model
    from pipeline.model.checkpoints import load_trained_model
    from pipeline.model.normalization import normalized
    from pipeline.stages.export import export_stage
    from pipeline.stages.train import train_stage

    extra = "training:\n  epochs: {epochs}\n  learning_rate: 0.003\n  precision: {precision}\n"
    mixed = load_config(
        small_config("mixed.yaml", n_hidden=48, extra=extra.format(epochs=4, precision="mixed_bfloat16"))
    )
    build_features(mixed)
    report = train_stage(Layout(mixed))
    losses = [e["train_loss"] for e in report.train_losses]
    assert losses[-1] < losses[0], losses
    reader = tf.train.load_checkpoint(report.latest_checkpoint)
    dtypes = reader.get_variable_to_dtype_map()
    assert {dtypes[k] for k in dtypes if k.startswith("weights/")} == {tf.float32}

    single = load_config(
        small_config("single.yaml", n_hidden=48, extra=extra.format(epochs=6, precision="float32"))
    )
    assert (
        Layout(single).train_run.root == Layout(mixed).train_run.root
    )  # precision is not in the fingerprint
    with caplog.at_level(logging.INFO):
        resumed = train_stage(Layout(single))
    assert any("Restored" in r.message and "epoch 4" in r.message for r in caplog.records)
    assert resumed.epochs_completed == 6 and resumed.global_step > report.global_step

    export = export_stage(Layout(mixed)).root
    samples = load_for_model(SAMPLE / "test" / "00002.flac", 16000)
    model = Model(export)
    checkpoint = load_trained_model(mixed, Layout(mixed).train_run.best, 26, 29)
    features = model.metadata.features.frames(samples)
    reference = checkpoint(normalized(checkpoint, features[None])).numpy()[0]
    np.testing.assert_allclose(model.logits(samples), reference, atol=1e-4)


@pytest.mark.slow
def test_jit_compiled_training_step_trains(small_config):
    """training.jit_compile: forward and backward as one XLA cluster (with the log-space CTC loss)."""
    from pipeline.stages.train import train_stage

    config = load_config(
        small_config(
            "jit.yaml",
            n_hidden=48,
            extra="training:\n  epochs: 3\n  learning_rate: 0.003\n  jit_compile: true\n",
        )
    )
    build_features(config)
    report = train_stage(Layout(config))
    losses = [e["train_loss"] for e in report.train_losses]
    assert losses[-1] < losses[0] and not report.skipped_batches, losses


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.long)])
def test_an_update_the_float16_loss_scale_skips_is_not_counted_as_made(small_config, caplog, jit):
    """mixed_float16 with the loss scale set so high that the first two steps' gradients overflow: the
    LossScaleOptimizer skips those updates and lowers the scale; the schedule, Adam's step count and the
    run's update count leave them out, and they are neither bad batches nor refused updates. Then, at a
    sane scale, the next two steps update. With ``jit_compile`` on one device the skip is decided inside
    the compiled step (issue 45 F4)."""
    import logging

    from native_client.alphabet import load_alphabet
    from pipeline.features.cache import read_cache
    from pipeline.train.distribute import make_strategy
    from pipeline.train.hooks import TrainHooks
    from pipeline.train.loop import Trainer
    from pipeline.train.policy import learning_rate
    from pipeline.train.tasks import TaskData

    extra = (
        "training:\n  epochs: 2\n  validation_epochs: 0\n  precision: mixed_float16\n  warmup_steps: 10\n"
        f"  jit_compile: {str(jit).lower()}\ndistribution:\n  strategy: one_device\n"
    )
    config = load_config(small_config(limit_train=8, extra=extra))
    build_features(config, ("train",))
    layout = Layout(config)
    train = read_cache(layout.features_cache("train"), config.features)
    trainer = None

    def sane_scale_after_2(info):
        if info.step == 2:
            assert int(trainer.state.updates.numpy()) == 0 and int(trainer.optimizer.iterations.numpy()) == 0
            trainer.step_optimizer.dynamic_scale.assign(2.0**10)

    trainer = Trainer(
        config,
        layout.train_run.root,
        [TaskData.only(train, None, load_alphabet(layout.alphabet))],
        make_strategy(config.distribution),
        hooks=TrainHooks(on_step=sane_scale_after_2),
    )
    trainer.step_optimizer.dynamic_scale.assign(2.0**60)
    with caplog.at_level(logging.INFO):
        report = trainer.fit()
    assert (report.global_step, report.updates, int(trainer.optimizer.iterations.numpy())) == (4, 2, 2)
    assert trainer._learning_rate() == pytest.approx(learning_rate(config.training, 1.0, 2))
    assert not report.skipped_batches
    overflowed = [r for r in caplog.records if "overflowed at the float16 loss scale" in r.message]
    assert len(overflowed) == 2 and "would make weights non-finite" not in caplog.text
