"""Weights of DeepSpeech 0.6+ and Coqui STT models, under this family's weight names (warm starts).

Their models have this family's geometry; only the names and the LSTM's layout
differ. Their TF1 variables: ``layer_{1,2,3,5,6}/weights`` ``[in, out]`` and
``/bias``; the LSTM's ``cudnn_lstm/rnn/multi_rnn_cell/cell_0/cudnn_compatible_lstm_cell/
kernel`` ``[n_input + n_hidden, 4 n_hidden]`` (the input rows, then the recurrent
ones) and ``bias``, gates in TensorFlow's order i, j (the cell input), f, o. Keras
keeps ``kernel`` and ``recurrent_kernel`` apart with gates i, f, c, o. DeepSpeech
since 0.6 runs the cell with ``forget_bias=0`` (for CuDNN compatibility), so the
bias is taken as it is; before 0.6 the cell added 1.0 to the forget gate at run time
(``forget_bias`` folds it in for such checkpoints).

Two sources:

- a TF1 checkpoint (a directory with a ``checkpoint`` file, or a prefix): read by
  variable name (the CuDNN-trained ones save the same canonical names);
- a ``.tflite`` export with DeepSpeech's metadata outputs: its FULLY_CONNECTED
  operators name their weights (``layer_1/weights/transpose``, ``.../cudnn_compatible_
  lstm_cell/kernel/transpose``, ``[out, in]``) while their biases carry generated names
  (``MatMul_bias``), so each bias is taken from the operator that uses the weights.
  Int8 weights (dynamic-range quantisation) are dequantised with their scales
  (``(q - zero_point) * scale``, per tensor or per channel).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

LSTM_SCOPE = "cudnn_lstm/rnn/multi_rnn_cell/cell_0/cudnn_compatible_lstm_cell"
DENSE = ("layer_1", "layer_2", "layer_3", "layer_5", "layer_6")
# Their gate blocks (i, j, f, o) in Keras' order (i, f, c=j, o).
KERAS_GATES = (0, 2, 1, 3)


def tf1_names() -> list[str]:
    """The TF1 variable names of a DeepSpeech model's weights."""
    return [f"{layer}/{part}" for layer in DENSE for part in ("weights", "bias")] + [
        f"{LSTM_SCOPE}/kernel",
        f"{LSTM_SCOPE}/bias",
    ]


def _gates(matrix: np.ndarray, order) -> np.ndarray:
    blocks = np.split(matrix, 4, axis=-1)
    return np.concatenate([blocks[i] for i in order], axis=-1)


def to_family_names(tf1: Callable[[str], np.ndarray], forget_bias: float = 0.0) -> dict[str, np.ndarray]:
    """This family's weights (``layer_1.kernel``, ``lstm.lstm_cell.recurrent_kernel``, ...) from
    ``tf1(name)``, a DeepSpeech model's TF1 variables; ``forget_bias`` is added to the forget gate's bias."""
    weights = {}
    for layer in DENSE:
        weights[f"{layer}.kernel"] = np.asarray(tf1(f"{layer}/weights"), np.float32)
        weights[f"{layer}.bias"] = np.asarray(tf1(f"{layer}/bias"), np.float32)
    kernel = _gates(np.asarray(tf1(f"{LSTM_SCOPE}/kernel"), np.float32), KERAS_GATES)
    bias = _gates(np.asarray(tf1(f"{LSTM_SCOPE}/bias"), np.float32), KERAS_GATES)
    n_hidden = bias.shape[0] // 4
    bias[n_hidden : 2 * n_hidden] += forget_bias
    n_input = kernel.shape[0] - n_hidden
    weights["lstm.lstm_cell.kernel"] = np.ascontiguousarray(kernel[:n_input])
    weights["lstm.lstm_cell.recurrent_kernel"] = np.ascontiguousarray(kernel[n_input:])
    weights["lstm.lstm_cell.bias"] = bias
    return weights


def to_tf1_names(family: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of ``to_family_names`` (forget bias 0): DeepSpeech's TF1 variables of this family's
    weights."""
    inverse = [KERAS_GATES.index(i) for i in range(4)]
    out = {}
    for layer in DENSE:
        out[f"{layer}/weights"] = family[f"{layer}.kernel"]
        out[f"{layer}/bias"] = family[f"{layer}.bias"]
    kernel = np.concatenate([family["lstm.lstm_cell.kernel"], family["lstm.lstm_cell.recurrent_kernel"]])
    out[f"{LSTM_SCOPE}/kernel"] = _gates(kernel, inverse)
    out[f"{LSTM_SCOPE}/bias"] = _gates(family["lstm.lstm_cell.bias"], inverse)
    return out


def _directory(path: Path) -> Path:
    return Path(path) if Path(path).is_dir() else Path(path).parent


def checkpoint_frontend(path: Path):
    """The ``deepspeech`` front end a TF1 checkpoint was trained with: DeepSpeech's defaults (16 kHz, 32 ms
    windows every 20 ms, 26 coefficients), or what the ``flags.txt`` DeepSpeech writes beside its
    checkpoints says (``--audio_sample_rate``, ``--feature_win_len``, ``--feature_win_step``)."""
    from native_client.frontends.deepspeech import DeepSpeechFrontEnd, DeepSpeechSettings

    flags = {"audio_sample_rate": "16000", "feature_win_len": "32", "feature_win_step": "20"}
    written = _directory(path) / "flags.txt"
    if written.is_file():
        for line in written.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.strip().lstrip("-").partition("=")
            if key in flags and value:
                flags[key] = value
    settings = DeepSpeechSettings(
        winlen=float(flags["feature_win_len"]) / 1000, winstep=float(flags["feature_win_step"]) / 1000
    )
    return DeepSpeechFrontEnd(settings, int(flags["audio_sample_rate"]))


def checkpoint_alphabet(path: Path):
    """The ``alphabet.txt`` Coqui STT keeps beside its checkpoints, or None."""
    from native_client.alphabet import load_alphabet

    found = _directory(path) / "alphabet.txt"
    return load_alphabet(found) if found.is_file() else None


def is_tf1_checkpoint(path: Path) -> bool:
    """True for a TF1 checkpoint (directory or prefix) holding DeepSpeech's ``layer_1/weights``."""
    import tensorflow as tf

    prefix = tf.train.latest_checkpoint(str(path)) if Path(path).is_dir() else str(path)
    if not prefix or not Path(prefix + ".index").is_file():
        return False
    return "layer_1/weights" in dict(tf.train.list_variables(prefix))


def read_tf1_checkpoint(path: Path) -> dict[str, np.ndarray]:
    """DeepSpeech's TF1 variables (``tf1_names``) from a checkpoint directory or prefix; KeyError names a
    missing one."""
    import tensorflow as tf

    prefix = tf.train.latest_checkpoint(str(path)) if Path(path).is_dir() else str(path)
    reader = tf.train.load_checkpoint(prefix)
    missing = [name for name in tf1_names() if not reader.has_tensor(name)]
    if missing:
        raise KeyError(f"{prefix}: not a DeepSpeech checkpoint, it lacks {', '.join(missing)}")
    return {name: reader.get_tensor(name) for name in tf1_names()}


def _dequantised(tensor, buffer: bytes) -> np.ndarray:
    from ai_edge_litert import schema_py_generated as schema

    kinds = {
        schema.TensorType.FLOAT32: np.float32,
        schema.TensorType.FLOAT16: np.float16,
        schema.TensorType.INT8: np.int8,
    }
    if tensor.Type() not in kinds:
        raise ValueError(f"{tensor.Name().decode()}: tensor type {tensor.Type()} is not float or int8")
    shape = tuple(int(n) for n in tensor.ShapeAsNumpy())
    values = np.frombuffer(buffer, kinds[tensor.Type()]).reshape(shape).astype(np.float32)
    quantization = tensor.Quantization()
    if tensor.Type() == schema.TensorType.INT8:
        scale = quantization.ScaleAsNumpy().astype(np.float32)
        zero = quantization.ZeroPointAsNumpy().astype(np.float32)
        if scale.size > 1:  # per channel along quantized_dimension
            axis = quantization.QuantizedDimension()
            shape_of = [1] * values.ndim
            shape_of[axis] = -1
            scale, zero = scale.reshape(shape_of), zero.reshape(shape_of)
        values = (values - zero) * scale
    return values


def read_tflite(path: Path) -> dict[str, np.ndarray]:
    """DeepSpeech's TF1 variables (``tf1_names``) from a ``.tflite`` export, dequantised; ValueError names
    what is missing."""
    from ai_edge_litert import schema_py_generated as schema

    data = Path(path).read_bytes()
    model = schema.Model.GetRootAsModel(data, 0)
    graph = model.Subgraphs(0)
    codes = [
        max(model.OperatorCodes(i).BuiltinCode(), model.OperatorCodes(i).DeprecatedBuiltinCode())
        for i in range(model.OperatorCodesLength())
    ]
    found: dict[str, np.ndarray] = {}
    for i in range(graph.OperatorsLength()):
        operator = graph.Operators(i)
        if codes[operator.OpcodeIndex()] != schema.BuiltinOperator.FULLY_CONNECTED:
            continue
        inputs = operator.InputsAsNumpy()
        weights = graph.Tensors(int(inputs[1]))
        name = weights.Name().decode()
        layer = next((ln for ln in (*DENSE, LSTM_SCOPE) if name.startswith(f"{ln}/")), None)
        if layer is None or f"{layer}/bias" in found:
            continue
        kernel_name = f"{layer}/kernel" if layer == LSTM_SCOPE else f"{layer}/weights"

        def tensor_value(tensor):
            return _dequantised(tensor, model.Buffers(tensor.Buffer()).DataAsNumpy().tobytes())

        found[kernel_name] = tensor_value(weights).T  # TFLite keeps [out, in]
        found[f"{layer}/bias"] = tensor_value(graph.Tensors(int(inputs[2])))
    missing = [name for name in tf1_names() if name not in found]
    if missing:
        raise ValueError(
            f"{path}: no fully connected operator uses {', '.join(missing)}; not a DeepSpeech model"
        )
    return found
