"""Fine-tuning from DeepSpeech/Coqui models: init_from reads the armspeech .tflite and TF1 checkpoints.

Tolerances, and why. The .tflite holds int8 weights with float activations (dynamic-range
quantisation): its fully connected layers quantise each input row to int8 on the fly
(asymmetric, per row; XNNPACK's kernels), multiply in integers and rescale. Our model holds the
dequantised weights and computes in float32, so it differs from the .tflite by that activation
rounding alone. The test shows both halves:

- run with the .tflite's arithmetic (``quantised_forward``: the imported weights requantised with
  their own scales, each row of activations quantised as above), our weights give the .tflite's
  probabilities within 0.05 (2e-7 to 0.03 measured per clip) and the same greedy transcript;
- run in float32 (as training runs it), our model gives probabilities within 0.25 of the .tflite's
  (0.17 measured; mean 0.002), the same best label on every frame where the .tflite is sure of it (top
  probability at least 0.2 above the second), and greedy transcripts that differ only in those unsure
  frames' letters (character error rate between the two at most 0.25, 0.00-0.21 measured on espeak-ng
  speech, far from the real speech it was trained on).
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import soundfile
import tensorflow as tf

from native_client import Model
from native_client.alphabet import Alphabet, load_alphabet
from native_client.decoders.greedy import best_path, log_softmax
from native_client.windows import window_view
from pipeline.config_loader import config_from_dict
from pipeline.evaluation.metrics import corpus_rates, score_sample
from pipeline.model import build_model
from pipeline.model.checkpoints import CheckpointMismatchError, warm_start
from pipeline.model.deepspeech_import import LSTM_SCOPE, read_tflite, to_family_names, to_tf1_names
from pipeline.model.weights import named_weights
from tests.conftest import ROOT

ARMENIAN = ROOT / "data" / "armenian"


def config_for(source, alphabet=ARMENIAN / "alphabet.txt", drop=0, **features):
    return config_from_dict(
        {
            "paths": {"alphabet": str(alphabet)},
            "features": {"type": "deepspeech", **features},
            "training": {"init_from": str(source), "drop_source_layers": drop},
        }
    )


def imported_model(source, config):
    alphabet = load_alphabet(config.paths.alphabet)
    model = build_model(config.model, 26, alphabet.n_classes)
    copied = warm_start(model, source, config.training.drop_source_layers, config, alphabet)
    return model, copied


def quantised_forward(tf1: dict, windows: np.ndarray) -> np.ndarray:
    """Log-probabilities of DeepSpeech's graph (the LSTM on [x, h] concatenated) run with dynamic-range
    int8 arithmetic: weights quantised per tensor (symmetric), activations per row (asymmetric, as
    XNNPACK's qd8 kernels do), 16 windows per call, the state carried."""

    def quantised(w):
        scale = np.abs(w).max() / 127
        return np.round(w / scale).astype(np.float32), scale

    weights = {name: quantised(value) for name, value in tf1.items() if name.endswith(("weights", "kernel"))}

    def dense(x, layer, relu=True):
        name = f"{layer}/kernel" if layer == LSTM_SCOPE else f"{layer}/weights"
        q, scale = weights[name]
        low, high = np.minimum(x.min(1, keepdims=True), 0), np.maximum(x.max(1, keepdims=True), 0)
        step = np.where(high > low, (high - low) / 255, 1.0)
        zero = np.round(-128 - low / step)
        rows = (np.clip(np.round(x / step) + zero, -128, 127) - zero).astype(np.float32)
        # Integer products summed in float32 (relative error ~1e-7, far below the tolerance), for speed.
        y = (rows @ q).astype(np.float64) * (step * scale) + tf1[f"{layer}/bias"]
        return np.minimum(np.maximum(y, 0), 20) if relu else y

    def sigmoid(v):
        return 1 / (1 + np.exp(-v))

    out, h, c = [], np.zeros((1, 2048)), np.zeros((1, 2048))
    for start in range(0, len(windows), 16):
        chunk = windows[start : start + 16].reshape(-1, 494)
        x = np.zeros((16, 494))
        x[: len(chunk)] = chunk
        x = dense(dense(dense(x, "layer_1"), "layer_2"), "layer_3")
        outputs = []
        for t in range(16):
            i, j, f, o = np.split(dense(np.concatenate([x[t : t + 1], h], 1), LSTM_SCOPE, relu=False), 4, 1)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(j)
            h = sigmoid(o) * np.tanh(c)
            outputs.append(h)
        y = dense(dense(np.concatenate(outputs), "layer_5"), "layer_6", relu=False)
        out.append(log_softmax(y)[: len(chunk)])
    return np.concatenate(out)


@pytest.fixture(scope="module")
def tflite(armspeech_model):
    return Model(armspeech_model)


@pytest.fixture(scope="module")
def imported(armspeech_model):
    model, copied = imported_model(armspeech_model, config_for(armspeech_model))
    return model, copied


def test_every_weight_of_the_tflite_loads_and_runs_as_the_tflite_does(tflite, imported):
    model, copied = imported
    assert sorted(copied) == sorted(named_weights(model)) and len(copied) == 13
    ours_tf1 = to_tf1_names({name: v.numpy() for name, v in named_weights(model).items()})
    for index in range(4):
        samples = soundfile.read(ARMENIAN / f"{index:02d}.flac", dtype="int16")[0]
        frames = tflite.metadata.features.frames(samples)
        theirs = tflite.logits(samples)
        alphabet = tflite.metadata.alphabet

        quantised = quantised_forward(ours_tf1, window_view(frames, 9))
        assert np.abs(np.exp(quantised) - np.exp(theirs)).max() < 0.05
        assert best_path(quantised, alphabet) == best_path(theirs, alphabet)

        floating = log_softmax(model(frames[None]).numpy()[0])
        assert np.abs(np.exp(floating) - np.exp(theirs)).max() < 0.25
        top = np.sort(np.exp(theirs), axis=1)
        sure = top[:, -1] - top[:, -2] >= 0.2
        np.testing.assert_array_equal(floating.argmax(1)[sure], theirs.argmax(1)[sure])
        assert score_sample("", best_path(theirs, alphabet), best_path(floating, alphabet), 0).cer <= 0.25


def test_under_global_normalisation_the_first_layer_is_folded_to_compute_what_the_source_did(
    tflite, armspeech_model, imported
):
    """``features.normalize: global`` with a Coqui model: the run's statistics fill the normalisation
    layer and are folded into ``layer_1``, so on normalised windows it gives what the source's gave on raw
    ones (windows inside the utterance); the logits differ only by what the edges' padding carries."""
    from native_client.cmvn import GlobalStats
    from pipeline.model.normalization import normalized, set_statistics

    raw_model, _ = imported
    samples = soundfile.read(ARMENIAN / "00.flac", dtype="int16")[0]
    frames = tflite.metadata.features.frames(samples)
    stats = GlobalStats(tuple(map(float, frames.mean(0))), tuple(map(float, frames.std(0))))
    config = config_for(armspeech_model, normalize="global")
    alphabet = load_alphabet(config.paths.alphabet)
    model = build_model(config.model, 26, alphabet.n_classes, normalized=True)
    set_statistics(model, stats)
    copied = warm_start(model, armspeech_model, 0, config, alphabet)
    assert len(copied) == 13  # the normalisation keeps the run's statistics
    np.testing.assert_array_equal(model.feature_normalization.mean.numpy(), np.float32(stats.mean))
    windows = window_view(frames, 9)[9:-9].reshape(-1, 494)  # windows with no padding frame
    theirs = raw_model.layer_1(windows).numpy()
    ours = model.layer_1(window_view(stats.apply(frames), 9)[9:-9].reshape(-1, 494)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-3)
    before = raw_model(frames[None]).numpy()[0].argmax(1)
    after = model(normalized(model, frames[None])).numpy()[0].argmax(1)
    assert (before == after).mean() > 0.95


def test_the_lstm_gates_are_reordered_and_no_forget_bias_is_added(armspeech_model, imported):
    model, _ = imported
    tf1 = read_tflite(armspeech_model)
    kernel, bias = tf1[f"{LSTM_SCOPE}/kernel"], tf1[f"{LSTM_SCOPE}/bias"]
    n = 2048
    # TensorFlow's blocks i, j, f, o; Keras' i, f, c, o. DeepSpeech 0.6+ runs the cell with forget_bias 0.
    np.testing.assert_array_equal(model.lstm.cell.kernel.numpy()[:, n : 2 * n], kernel[:n, 2 * n : 3 * n])
    np.testing.assert_array_equal(
        model.lstm.cell.recurrent_kernel.numpy()[:, 2 * n : 3 * n], kernel[n:, n : 2 * n]
    )
    np.testing.assert_array_equal(model.lstm.cell.bias.numpy()[n : 2 * n], bias[2 * n : 3 * n])
    older = to_family_names(tf1.__getitem__, forget_bias=1.0)["lstm.lstm_cell.bias"]
    np.testing.assert_array_equal(older[n : 2 * n], bias[2 * n : 3 * n] + 1.0)


def test_a_deepspeech_tf1_checkpoint_loads_the_same_weights(armspeech_model, imported, tmp_path):
    tf1 = read_tflite(armspeech_model)
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    with tf.Graph().as_default():
        variables = [tf.compat.v1.get_variable(name, initializer=value) for name, value in tf1.items()]
        # What a training checkpoint holds besides the weights: optimizer slots, the step.
        variables.append(
            tf.compat.v1.get_variable("layer_1/weights/Adam", initializer=np.ones((494, 2048), "f"))
        )
        variables.append(tf.compat.v1.get_variable("global_step", initializer=np.int64(1234)))
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(directory / "best_dev"), global_step=1234)
    (directory / "flags.txt").write_text(
        "--feature_win_len=32\n--feature_win_step=20\n--audio_sample_rate=16000\n"
    )
    model, copied = imported_model(directory, config_for(directory))
    reference, _ = imported
    assert len(copied) == 13
    for name, variable in named_weights(model).items():
        np.testing.assert_array_equal(variable.numpy(), named_weights(reference)[name].numpy())

    (directory / "flags.txt").write_text("--feature_win_len=25\n--feature_win_step=10\n")
    with pytest.raises(
        CheckpointMismatchError,
        match=r"training.init_from: .*checkpoints was trained on "
        r"DeepSpeech's features \(16000 Hz, .*'winlen': 0.025",
    ):
        imported_model(directory, config_for(directory))


def test_another_alphabet_needs_drop_source_layers_and_then_loads_all_but_the_output(
    armspeech_model, imported, tmp_path
):
    labels = load_alphabet(ARMENIAN / "alphabet.txt").labels
    swapped = tmp_path / "swapped.txt"
    swapped.write_text(
        Alphabet(labels[:1] + labels[2:3] + labels[1:2] + labels[3:]).to_text(), encoding="utf-8"
    )
    with pytest.raises(
        CheckpointMismatchError,
        match=r"has another alphabet than paths.alphabet \(40 labels .* "
        r"set training.drop_source_layers: 1",
    ):
        imported_model(armspeech_model, config_for(armspeech_model, swapped))

    latin = tmp_path / "latin.txt"
    latin.write_text(Alphabet(tuple(" abcdefghijklmnopqrstuvwxyz'")).to_text(), encoding="utf-8")
    model, copied = imported_model(armspeech_model, config_for(armspeech_model, latin, drop=1))
    assert model.layer_6.kernel.shape == (2048, 29) and not any(name.startswith("layer_6") for name in copied)
    reference, _ = imported
    np.testing.assert_array_equal(model.layer_5.kernel.numpy(), reference.layer_5.kernel.numpy())
    np.testing.assert_array_equal(model.lstm.cell.bias.numpy(), reference.lstm.cell.bias.numpy())


def test_the_runs_features_must_be_the_models(armspeech_model):
    config = config_from_dict(
        {
            "paths": {"alphabet": str(ARMENIAN / "alphabet.txt")},
            "training": {"init_from": str(armspeech_model)},
        }
    )
    with pytest.raises(
        CheckpointMismatchError,
        match=r"the run computes features.type 'mfcc': set features.type: "
        r"deepspeech with those settings",
    ):
        imported_model(armspeech_model, config)
    with pytest.raises(CheckpointMismatchError, match="features.type 'deepspeech'"):
        imported_model(armspeech_model, config_for(armspeech_model, winstep=0.01))


@pytest.mark.long
@pytest.mark.slow
def test_fine_tuning_from_the_tflite_runs_through_train(armspeech_model, tmp_path):
    """Features and Train on the four Armenian clips, warm-started from the .tflite at a negligible
    learning rate: the validation decodes like the .tflite itself (its CER within 0.05 of the .tflite's; a
    fresh model's is about 1)."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.stages.train import train_stage
    from tests.conftest import build_features

    manifest = tmp_path / "clips.csv"
    manifest.write_text(
        "wav_filename,wav_filesize,transcript\n"
        + "".join(
            f"{ARMENIAN / line.split(',')[0]},{','.join(line.split(',')[1:])}\n"
            for line in (ARMENIAN / "clips.csv").read_text(encoding="utf-8").splitlines()[1:]
        ),
        encoding="utf-8",
    )
    config_path = tmp_path / "finetune.yaml"
    config_path.write_text(
        textwrap.dedent(f"""
        paths: {{work_dir: {tmp_path / "work"}, alphabet: {ARMENIAN / "alphabet.txt"}}}
        data: {{train_files: [{manifest}], dev_files: [{manifest}], test_files: [{manifest}]}}
        features: {{type: deepspeech, workers: 1}}
        model: {{n_hidden: 2048, dropout_rate: 0.0}}
        training: {{epochs: 1, batch_size: 4, dev_batch_size: 4, learning_rate: 1.0e-9,
                    init_from: {armspeech_model}}}
        augment: {{speed_factors: []}}
    """)
    )
    config = load_config(config_path)
    build_features(config)
    report = train_stage(Layout(config))
    tflite = Model(armspeech_model)
    rows = [line.split(",") for line in (ARMENIAN / "clips.csv").read_text(encoding="utf-8").splitlines()[1:]]
    results = [
        score_sample("", text, tflite.transcribe(soundfile.read(ARMENIAN / name, dtype="int16")[0]), 0.0)
        for name, _, text in rows
    ]
    assert report.global_step == 1
    assert abs(report.best_dev.cer - corpus_rates(results)["cer"]) <= 0.05
