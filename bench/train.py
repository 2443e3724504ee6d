"""Training throughput: the fused LSTM step against the old one (Keras' LSTM layer), the new default \
against the old, Keras ``model.fit``, the input pipeline alone, and the en.yaml model size.

All in one process on the sample train split (features built into a
temporary work dir). Audio seconds trained per wall second are measured
over a second epoch (the first pays for tracing).

- ``step_ratio``: the same trainer on the same batches, ``model.deepspeech.lstm_kernel``
  fused against layer (what every step did before): the step's own speed-up.
- ``default_ratio``: today's embedded default (``configs/sample.yaml``: its
  front end, fused LSTM) against the old one (``mfcc`` at 10 ms, layer), per
  audio second: what ``make train`` gains per epoch.
- ``en_step_ratio``: fused against layer at ``configs/en.yaml``'s n_hidden
  (2048) on a few steps, and the fused run's FLOP/s as a share of this
  machine's measured matmul FLOP/s (MFU).

The last line is one JSON object with those keys and the rates behind them.

    python bench/train.py [--samples 320] [--en-steps 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import h5py
import keras
import numpy as np
import tensorflow as tf

from native_client.alphabet import load_alphabet
from pipeline.batches.dataset import SplitReader, batch_plan, train_dataset
from pipeline.config_loader import load_config
from pipeline.features.cache import CacheIndex, FeatureReader
from pipeline.features.cmvn import train_statistics
from pipeline.features.frontend import feature_pipeline
from pipeline.layout import Layout
from pipeline.model import build_model
from pipeline.model.ctc import KERNEL, ctc_loss
from pipeline.model.normalization import normalized, set_statistics
from pipeline.stages.features import features_stage
from pipeline.stages.outputs import split_cache as stage_split_cache
from pipeline.train.distribute import make_strategy
from pipeline.train.hooks import TrainHooks
from pipeline.train.loop import Trainer
from pipeline.train.tasks import TaskData

ROOT = Path(__file__).resolve().parent.parent


def with_lstm(config, lstm_kernel: str):
    """``config`` with ``model.deepspeech.lstm_kernel`` set."""
    return replace(
        config, model=replace(config.model, options=replace(config.model.options, lstm_kernel=lstm_kernel))
    )


def trainer_rate(config, data, alphabet, run_dir) -> float:
    """Audio seconds per second of the project's trainer over its second epoch."""
    marks = []
    trainer = Trainer(
        config,
        run_dir,
        [TaskData.only(data, None, alphabet)],
        make_strategy(config.distribution),
        hooks=TrainHooks(on_epoch=lambda info: marks.append(time.perf_counter())),
    )
    trainer.fit()
    return float(data.durations.sum()) / (marks[1] - marks[0])


class _CTCModel(keras.Model):
    """The same acoustic model trained through ``model.fit`` with a CTC ``train_step``."""

    def __init__(self, inner, blank: int):
        super().__init__()
        self.inner = inner
        self.blank = blank

    def call(self, windows, training=False):
        return self.inner(normalized(self.inner, windows), training=training)

    def train_step(self, batch):
        windows, lengths, labels, label_lengths, _ = batch
        with tf.GradientTape() as tape:
            logits = self.inner(normalized(self.inner, windows), training=True)
            loss = tf.reduce_mean(ctc_loss(labels, label_lengths, logits, lengths, self.blank, KERNEL))
        grads = tape.gradient(loss, self.inner.trainable_variables)
        self.optimizer.apply(grads, self.inner.trainable_variables)
        return {"loss": loss}


def keras_fit_rate(config, data, alphabet) -> float:
    """Audio seconds per second of ``model.fit`` on the identical model and batches."""
    inner = build_model(
        config.model, data.n_input, alphabet.n_classes, normalized=config.features.normalize == "global"
    )
    if config.features.normalize == "global":
        set_statistics(inner, train_statistics([data.path]))
    model = _CTCModel(inner, alphabet.blank_index)
    model.compile(optimizer=keras.optimizers.Adam(config.training.learning_rate))
    plan = batch_plan(data.lengths, config.training.batch_size, 1)
    dataset = train_dataset(SplitReader(data), plan, 1, 0, 1, 0, 0, 1, config.training.shuffle_seed)
    marks = []
    callback = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: marks.append(time.perf_counter())
    )
    model.fit(dataset, epochs=2, verbose=0, callbacks=[callback])
    return float(data.durations.sum()) / (marks[1] - marks[0])


class _InMemoryReader(FeatureReader):
    """The baseline: the same batches from the whole split's features held in memory."""

    def __init__(self, data: CacheIndex):
        super().__init__(data.path, data.offsets, data.lengths, data.n_input)
        with h5py.File(data.path, "r") as h5:
            self.frames = h5["features"][...]

    def _features(self):
        return self.frames


def input_rate(config, data, in_memory: bool = False) -> float:
    """Audio seconds per second of the input pipeline alone (batches made and consumed, no model): the
    disk reader the trainer uses, or (``in_memory``) the same batches from features held in memory."""
    reader = SplitReader(data)
    if in_memory:
        reader.reader = _InMemoryReader(data)
    plan = batch_plan(data.lengths, config.training.batch_size, 1)
    best = 0.0
    for epoch in range(2):
        dataset = train_dataset(reader, plan, 1, 0, 1, epoch, 0, epoch + 1, config.training.shuffle_seed)
        started = time.perf_counter()
        for batch in dataset:
            batch[0].numpy()
        best = max(best, float(data.durations.sum()) / (time.perf_counter() - started))
    return best


def matmul_flops() -> float:
    """Measured dense float32 matmul FLOP/s of this machine (2048 x 2048, best of a few runs)."""
    a = tf.random.normal([2048, 2048])
    b = tf.random.normal([2048, 2048])
    matmul = tf.function(lambda x, y: tf.matmul(x, y))
    matmul(a, b).numpy()
    best = 0.0
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(10):
            out = matmul(a, b)
        out.numpy()
        best = max(best, 10 * 2 * 2048**3 / (time.perf_counter() - started))
    return best


def model_flops_per_frame(n_input_window: int, hidden: int, classes: int) -> float:
    """Forward + backward FLOPs of one time step (3x the forward multiply-adds x 2)."""
    macs = (
        n_input_window * hidden
        + 2 * hidden * hidden
        + 8 * hidden * hidden
        + hidden * hidden
        + hidden * classes
    )
    return 3 * 2 * macs


def en_size(config, data, alphabet, run_dir, steps: int) -> tuple[float, float, float]:
    """(fused step against layer, the fused run's FLOP/s, its MFU percent) at the en.yaml model size on
    a few steps."""
    en = load_config(ROOT / "configs" / "en.yaml")
    subset_size = config.training.batch_size * steps
    order = np.argsort(data.lengths)[len(data.lengths) // 2 :][:subset_size]
    subset = CacheIndex(
        path=data.path,
        n_input=data.n_input,
        offsets=data.offsets[order],
        lengths=data.lengths[order],
        labels=[data.labels[i] for i in order],
        transcripts=[data.transcripts[i] for i in order],
        paths=[data.paths[i] for i in order],
        durations=data.durations[order],
    )
    big = load_config(
        ROOT / "configs" / "sample.yaml",
        {
            "paths": {"work_dir": str(run_dir)},
            "model": {"deepspeech": {"n_hidden": en.model.options.n_hidden, "dropout_rate": 0.05}},
            "training": {"epochs": 2, "validation_epochs": 0, "checkpoint_secs": 100000},
            "augment": {"speed_factors": []},
        },
    )
    rate = trainer_rate(with_lstm(big, "fused"), subset, alphabet, run_dir / "en-fused")
    old = trainer_rate(with_lstm(big, "layer"), subset, alphabet, run_dir / "en-layer")
    features = feature_pipeline(big.features)
    frames_per_audio_second = 1.0 / features.seconds_per_frame
    window = (2 * big.model.options.n_context + 1) * features.feature_size
    achieved = (
        rate
        * frames_per_audio_second
        * model_flops_per_frame(window, en.model.options.n_hidden, alphabet.n_classes)
    )
    return rate / old, achieved, 100.0 * achieved / matmul_flops()


def split_cache(config) -> CacheIndex:
    """The train split's features of ``config``, built into its work dir."""
    layout = Layout(config)
    features_stage(layout, "train")
    return stage_split_cache(layout, "train")


def main(argv=None) -> int:
    """Run every measurement and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=320, help="training utterances per epoch")
    parser.add_argument("--en-steps", type=int, default=2, help="steps per epoch for the en-size runs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        settings = {
            "data": {"limit_train": args.samples},
            "training": {"epochs": 2, "validation_epochs": 0, "checkpoint_secs": 100000},
            "augment": {"speed_factors": []},
        }
        config = load_config(
            ROOT / "configs" / "sample.yaml", {**settings, "paths": {"work_dir": f"{work}/default"}}
        )
        old_default = load_config(
            ROOT / "configs" / "sample.yaml",
            {**settings, "paths": {"work_dir": f"{work}/mfcc"}, "features": {"type": "mfcc"}},
        )
        data = split_cache(config)
        mfcc_data = split_cache(old_default)
        alphabet = load_alphabet(Layout(config).alphabet)
        run = Path(work)
        fused = trainer_rate(with_lstm(config, "fused"), data, alphabet, run / "fused")
        layer = trainer_rate(with_lstm(config, "layer"), data, alphabet, run / "layer")
        old = trainer_rate(with_lstm(old_default, "layer"), mfcc_data, alphabet, run / "old")
        fit = keras_fit_rate(config, data, alphabet)
        feed = input_rate(config, data)
        feed_memory = input_rate(config, data, in_memory=True)
        en_ratio, achieved, mfu = en_size(config, data, alphabet, run, args.en_steps)
    front_end = feature_pipeline(config.features).type_name
    print(
        f"step ({front_end}, n_hidden {config.model.options.n_hidden}): fused LSTM {fused:.1f} audio s/s, "
        f"layer {layer:.1f}: {fused / layer:.2f}x; default against the old (mfcc, layer, {old:.1f}): "
        f"{fused / old:.2f}x; keras fit: {fit:.1f}; input alone: {feed:.0f} from disk, "
        f"{feed_memory:.0f} from memory; n_hidden 2048: fused {en_ratio:.2f}x the layer, "
        f"{achieved / 1e9:.1f} GFLOP/s = {mfu:.1f}% of measured matmul FLOP/s",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "trainer_audio_s_per_s": round(fused, 2),
                "layer_lstm_audio_s_per_s": round(layer, 2),
                "step_ratio": round(fused / layer, 3),
                "old_default_audio_s_per_s": round(old, 2),
                "default_ratio": round(fused / old, 3),
                "keras_fit_audio_s_per_s": round(fit, 2),
                "ratio_vs_keras": round(fused / fit, 3),
                "input_audio_s_per_s": round(feed, 1),
                "input_ratio": round(feed / fused, 1),
                "input_memory_audio_s_per_s": round(feed_memory, 1),
                "input_disk_vs_memory": round(feed / feed_memory, 3),
                "en_step_ratio": round(en_ratio, 3),
                "en_mfu_percent": round(mfu, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    sys.exit(main())
