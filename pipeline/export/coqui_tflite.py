"""A DeepSpeech-family model as DeepSpeech 0.9 / Coqui STT ``.tflite`` (``export.coqui_tflite``).

Their native clients and apps load a flatbuffer by tensor names (coqui-ai/STT
``native_client/tflitemodelstate.cc``, training ``export.py``):

- inputs ``input_node`` ``[1, n_steps, 2 n_context + 1, n_input]``, ``previous_state_c`` and
  ``previous_state_h`` ``[1, n_hidden]``, ``input_samples`` ``[window]``;
- outputs ``logits`` ``[n_steps, n_classes]`` (softmaxed), ``new_state_c``, ``new_state_h``,
  ``mfccs`` ``[1, n_input]`` (TensorFlow's AudioSpectrogram + Mfcc of one window: TFLite's
  converter writes them as custom operators that TFLite's own op resolver implements, as
  their export does with ``allow_custom_ops``; they are not TFLite builtins, and the
  select-TF-ops route would need the Flex delegate, which their clients do not link), and
  the constants ``metadata_version`` (6), ``metadata_sample_rate``, ``metadata_feature_win_len``
  and ``_step`` (ms), ``metadata_beam_width`` and ``metadata_alphabet`` (serialised:
  ``native_client.deepspeech_tflite.deserialize_alphabet``).

The graph is built in TF1 style (placeholders, the weights frozen as constants named as
DeepSpeech names its variables) because the converter keeps placeholder and node names as
tensor names only on that path, and the LSTM is unrolled over ``[x, h]`` with TensorFlow's
gate order i, j, f, o, as their static-RNN export is.
"""

from __future__ import annotations

import struct

from native_client.alphabet import Alphabet
from native_client.frontends import FeaturePipeline
from pipeline.model.deepspeech_import import DENSE, LSTM_SCOPE, to_tf1_names
from pipeline.model.weights import named_weights

GRAPH_VERSION = 6


def serialise_alphabet(alphabet: Alphabet) -> bytes:
    """DeepSpeech's serialised alphabet: uint16 count, then per label uint16 index, uint16 length, UTF-8."""
    out = struct.pack("<H", alphabet.size)
    for index, label in enumerate(alphabet.labels):
        data = label.encode("utf-8")
        out += struct.pack("<HH", index, len(data)) + data
    return out


def check_exportable(features: FeaturePipeline, architecture: str) -> None:
    """ValueError naming the key unless their native client can run the model: the deepspeech family,
    DeepSpeech's features with its filterbank (the client computes them itself), no normalisation, and
    windows of whole milliseconds (the metadata holds milliseconds)."""
    frontend = features.frontend
    if architecture != "deepspeech":
        raise ValueError(
            f"model.architecture: the Coqui layout holds the deepspeech family, not {architecture!r}"
        )
    if features.type_name != "deepspeech":
        raise ValueError(
            f"features.type: the Coqui layout needs deepspeech (their client computes DeepSpeech's "
            f"MFCC itself), not {features.type_name!r}"
        )
    if features.normalize:
        raise ValueError("features.normalize: their client does not normalise features; set it to false")
    s = frontend.settings
    if s.filterbank_channels != 40 or s.lowfreq != 20.0 or frontend.upper != frontend.sample_rate / 2:
        raise ValueError(
            "features.filterbank_channels/lowfreq/highfreq: their client computes 40 channels from "
            "20 Hz to half the sample rate; keep the deepspeech front end's defaults"
        )
    for key in ("winlen", "winstep"):
        ms = getattr(s, key) * 1000
        if abs(ms - round(ms)) > 1e-9:
            raise ValueError(f"features.{key}: {getattr(s, key)} s is not a whole number of milliseconds")


def build_graph(
    model, features: FeaturePipeline, alphabet: Alphabet, n_steps: int, beam_width: int, language: str = ""
):
    """The TF1 graph in their layout: ``(graph, inputs, outputs)`` (tensor lists in their order);
    ``language``: their ``metadata_language`` (a BCP 47 tag), none when empty or ``und``."""
    import tensorflow as tf

    v1 = tf.compat.v1
    settings = model.settings  # a DeepSpeech model (AcousticModel)
    weights = to_tf1_names({name: v.numpy() for name, v in named_weights(model).items()})
    frontend, n_input = features.frontend, model.n_input
    window, n_hidden, clip = 2 * settings.n_context + 1, settings.n_hidden, settings.relu_clip
    graph = tf.Graph()
    with graph.as_default():
        samples = v1.placeholder(tf.float32, [frontend.frame_length], name="input_samples")
        spectrogram = tf.raw_ops.AudioSpectrogram(
            input=tf.expand_dims(samples, -1),
            window_size=frontend.frame_length,
            stride=frontend.frame_step,
            magnitude_squared=True,
        )
        coefficients = tf.raw_ops.Mfcc(
            spectrogram=spectrogram,
            sample_rate=frontend.sample_rate,
            upper_frequency_limit=float(frontend.upper),
            lower_frequency_limit=float(frontend.settings.lowfreq),
            filterbank_channel_count=frontend.settings.filterbank_channels,
            dct_coefficient_count=n_input,
        )
        mfccs = tf.identity(tf.reshape(coefficients, [-1, n_input]), name="mfccs")
        windows = v1.placeholder(tf.float32, [1, n_steps, window, n_input], name="input_node")
        state_c = v1.placeholder(tf.float32, [1, n_hidden], name="previous_state_c")
        state_h = v1.placeholder(tf.float32, [1, n_hidden], name="previous_state_h")

        def dense(x, layer, relu=True):
            # The converter names a fully connected layer's weights after the product: DeepSpeech's names.
            product = tf.matmul(x, tf.constant(weights[f"{layer}/weights"]), name=f"{layer}/weights")
            y = tf.nn.bias_add(product, tf.constant(weights[f"{layer}/bias"]))
            return tf.minimum(tf.nn.relu(y), clip) if relu else y

        x = tf.reshape(windows, [n_steps, window * n_input])
        for layer in DENSE[:3]:
            x = dense(x, layer)
        # Stored as TFLite keeps it ([out, in]) under DeepSpeech's name: one constant for the 16 products.
        kernel = tf.constant(weights[f"{LSTM_SCOPE}/kernel"].T, name=f"{LSTM_SCOPE}/kernel/transpose")
        bias = tf.constant(weights[f"{LSTM_SCOPE}/bias"])
        c, h, outputs = state_c, state_h, []
        for t in range(n_steps):
            product = tf.matmul(tf.concat([x[t : t + 1], h], axis=1), kernel, transpose_b=True)
            z = tf.nn.bias_add(product, bias)
            i, j, f, o = tf.split(z, 4, axis=1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(j)
            h = tf.sigmoid(o) * tf.tanh(c)
            outputs.append(h)
        y = dense(dense(tf.concat(outputs, axis=0), "layer_5"), "layer_6", relu=False)
        logits = tf.nn.softmax(y, name="logits")
        new_c, new_h = tf.identity(c, name="new_state_c"), tf.identity(h, name="new_state_h")
        metadata = [
            tf.constant([GRAPH_VERSION], name="metadata_version"),
            tf.constant([frontend.sample_rate], name="metadata_sample_rate"),
            tf.constant([round(frontend.settings.winlen * 1000)], name="metadata_feature_win_len"),
            tf.constant([round(frontend.settings.winstep * 1000)], name="metadata_feature_win_step"),
            tf.constant([beam_width], name="metadata_beam_width"),
            tf.constant([serialise_alphabet(alphabet)], name="metadata_alphabet"),
        ]
        if language and language != "und":
            metadata.append(tf.constant([language.encode("utf-8")], name="metadata_language"))
    return graph, [windows, state_c, state_h, samples], [logits, new_c, new_h, mfccs, *metadata]


def write_coqui_tflite(
    model,
    features: FeaturePipeline,
    alphabet: Alphabet,
    path,
    n_steps: int,
    beam_width: int,
    quantize: bool,
    language: str = "",
) -> None:
    """Convert ``model`` (the deepspeech family, weights loaded) to ``path`` in their layout; dynamic-range
    int8 weights when ``quantize`` (as their published models); ``language``: the model card's, as their
    ``metadata_language``. ValueError when the model or its features do not fit their client
    (``check_exportable``)."""
    import tensorflow as tf

    check_exportable(features, model.model_config.architecture)
    graph, inputs, outputs = build_graph(model, features, alphabet, n_steps, beam_width, language)
    with tf.compat.v1.Session(graph=graph) as session:
        converter = tf.compat.v1.lite.TFLiteConverter.from_session(session, inputs, outputs)
        converter.allow_custom_ops = True  # AudioSpectrogram, Mfcc: custom ops TFLite's resolver implements
        if quantize:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            # Per-tensor weights and float inputs to the products, as their exports have: FULLY_CONNECTED
            # version 3 (TFLite 1.14+). The default quantizer's per-channel weights and asymmetrically
            # quantised inputs need version 12 (TFLite 2.17), which their clients' runtimes do not have.
            converter.experimental_new_dynamic_range_quantizer = False
            converter._experimental_disable_per_channel = True
        flatbuffer = converter.convert()
    with open(path, "wb") as handle:
        handle.write(flatbuffer)
