"""Runners for one streaming step of an exported model: TFLite, SavedModel or frozen graph.

Each runner maps ``(windows [1, n_steps, window, n_input], state_h, state_c)`` to
``(logits [n_steps, n_classes], state_h, state_c)``. A reset is a zero state.
"""

from __future__ import annotations

import numpy as np

from native_client.metadata import ExportError, ExportMetadata

BACKENDS = ("tflite", "saved_model", "frozen_graph")


class StepRunner:
    """Base: holds the metadata and makes zero states."""

    def __init__(self, metadata: ExportMetadata):
        self.metadata = metadata

    def zero_state(self) -> tuple[np.ndarray, np.ndarray]:
        """The LSTM state at the start of an utterance."""
        zeros = np.zeros((1, self.metadata.n_hidden), np.float32)
        return zeros, zeros.copy()

    def step(self, windows: np.ndarray, state_h: np.ndarray, state_c: np.ndarray):
        """One call of ``n_steps`` windows; returns logits ``[n_steps, n_classes]`` and the new state."""
        raise NotImplementedError


def _tflite_interpreter(path: str, threads: int):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # TensorFlow's bundled interpreter does the same job
        from tensorflow.lite import Interpreter
    return Interpreter(model_path=path, num_threads=threads)


class TFLiteRunner(StepRunner):
    """The TFLite flatbuffer through LiteRT (``ai-edge-litert``) or TensorFlow's interpreter."""

    def __init__(self, metadata: ExportMetadata, threads: int = 1):
        super().__init__(metadata)
        path = metadata.path("tflite")
        if not path.is_file():
            raise ExportError(f"{path}: TFLite model missing from the export")
        self.interpreter = _tflite_interpreter(str(path), threads)
        self.interpreter.allocate_tensors()
        # Tensor indices from the signature, then plain set_tensor/invoke: less overhead per step.
        runner = self.interpreter.get_signature_runner(metadata.tensors["signature"])
        self._inputs = {name: detail["index"] for name, detail in runner.get_input_details().items()}
        self._outputs = {name: detail["index"] for name, detail in runner.get_output_details().items()}

    def step(self, windows, state_h, state_c):
        names = self.metadata.tensors
        interpreter = self.interpreter
        interpreter.set_tensor(self._inputs[names["input"]], windows.astype(np.float32, copy=False))
        interpreter.set_tensor(self._inputs[names["state_h"]], state_h)
        interpreter.set_tensor(self._inputs[names["state_c"]], state_c)
        interpreter.invoke()
        return (
            interpreter.get_tensor(self._outputs[names["logits"]])[0],
            interpreter.get_tensor(self._outputs[names["new_state_h"]]),
            interpreter.get_tensor(self._outputs[names["new_state_c"]]),
        )


class SavedModelRunner(StepRunner):
    """The SavedModel's streaming signature through TensorFlow."""

    def __init__(self, metadata: ExportMetadata, threads: int = 1):
        super().__init__(metadata)
        import tensorflow as tf

        _limit_tf_threads(tf, threads)
        self.loaded = tf.saved_model.load(str(metadata.path("saved_model")))
        self.function = self.loaded.signatures[metadata.tensors["signature"]]

    def step(self, windows, state_h, state_c):
        names = self.metadata.tensors
        out = self.function(
            **{
                names["input"]: windows.astype(np.float32, copy=False),
                names["state_h"]: state_h,
                names["state_c"]: state_c,
            }
        )
        return (
            out[names["logits"]].numpy()[0],
            out[names["new_state_h"]].numpy(),
            out[names["new_state_c"]].numpy(),
        )


class FrozenGraphRunner(StepRunner):
    """The frozen GraphDef (``output_graph.pb``) through TensorFlow."""

    def __init__(self, metadata: ExportMetadata, threads: int = 1):
        super().__init__(metadata)
        import tensorflow as tf

        _limit_tf_threads(tf, threads)
        self._tf = tf
        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(metadata.path("frozen_graph").read_bytes())
        names = metadata.raw["frozen_graph"]
        wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
        graph = wrapped.graph
        self.function = wrapped.prune(
            [graph.as_graph_element(names["inputs"][key]) for key in ("input", "state_h", "state_c")],
            [
                graph.as_graph_element(names["outputs"][key])
                for key in ("logits", "new_state_h", "new_state_c")
            ],
        )

    def step(self, windows, state_h, state_c):
        tf = self._tf
        logits, h, c = self.function(
            tf.constant(windows, tf.float32), tf.constant(state_h), tf.constant(state_c)
        )
        return logits.numpy()[0], h.numpy(), c.numpy()


def _limit_tf_threads(tf, threads: int) -> None:
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # TensorFlow already started; keep its settings
        pass


def make_runner(metadata: ExportMetadata, backend: str = "tflite", threads: int = 1) -> StepRunner:
    """The runner for ``backend`` (one of BACKENDS)."""
    runners = {"tflite": TFLiteRunner, "saved_model": SavedModelRunner, "frozen_graph": FrozenGraphRunner}
    if backend not in runners:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return runners[backend](metadata, threads)
