"""Runners of an exported model: TFLite, SavedModel, frozen graph or ONNX.

For a model with a streaming form, each runner maps ``(inputs, state)`` to ``(logits [labels, n_classes],
new state)``: the inputs what the metadata's ``streaming`` says one call takes (context windows ``[1,
n_steps, window, n_input]`` for DeepSpeech, or frames ``[1, lookback + chunk + lookahead, n_input]``),
the state a tuple of arrays in the order of the metadata's ``tensors["state"]`` (the LSTM's h and c for
DeepSpeech). A reset is a zero state. For a model without one (``streaming`` null), ``utterance`` maps a whole
utterance's frames ``[time, n_input]`` to its logits ``[labels, n_classes]``.
"""

from __future__ import annotations

import numpy as np

from native_client.litert import open_tflite
from native_client.metadata import METADATA_NAME, ExportError, ExportMetadata

BACKENDS = ("tflite", "saved_model", "frozen_graph", "onnx")


class StepRunner:
    """Base: holds the metadata and makes zero states."""

    backend = ""  # its name in BACKENDS

    def __init__(self, metadata: ExportMetadata):
        self.metadata = metadata

    def zero_state(self) -> tuple[np.ndarray, ...]:
        """The recurrent state at the start of an utterance."""
        return tuple(np.zeros(spec["shape"], np.float32) for spec in self.metadata.state)

    def step(self, windows: np.ndarray, state: tuple) -> tuple[np.ndarray, tuple]:
        """One streaming call; returns logits ``[labels, n_classes]`` and the new state."""
        raise NotImplementedError

    def signature_caller(self):
        """``call(signature, inputs) -> outputs`` over the export's other signatures (a transducer's
        predictor and joiner), safe to use beside ``step`` on another thread. ExportError for a backend
        whose file holds the streaming step only."""
        raise ExportError(
            f"{self.metadata.directory}: the {self.backend} backend holds the encoder only; a transducer's "
            f"predictor and joiner run on the tflite or saved_model backend (--backend)"
        )

    def utterance(self, frames: np.ndarray) -> np.ndarray:
        """Logits ``[labels, n_classes]`` of a whole utterance's frames ``[time, n_input]`` (a model
        without a streaming form)."""
        if not len(frames):
            return np.zeros((0, self.metadata.output_width), np.float32)
        return self._utterance(np.ascontiguousarray(frames, np.float32)[None])

    def _utterance(self, features: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class TFLiteRunner(StepRunner):
    """The TFLite flatbuffer through LiteRT (``ai-edge-litert``) or TensorFlow's interpreter
    (``native_client.litert``: the streaming step with every weight packed once)."""

    backend = "tflite"

    def __init__(self, metadata: ExportMetadata, threads: int = 1):
        super().__init__(metadata)
        self.threads = threads
        path = metadata.path("tflite")
        if not path.is_file():
            raise ExportError(f"{path}: TFLite model missing from the export")
        # The weight cache only for the context-window step it was checked on (native_client/litert.py);
        # a whole utterance changes the input's length at every call: the Interpreter resizes for it.
        windows = metadata.streaming is not None and not metadata.streaming.frames
        try:
            self.model = open_tflite(str(path), threads, shared_weights=windows)
        except (ValueError, RuntimeError) as error:  # LiteRT's message names no file
            raise ExportError(f"{path}: not a TFLite model LiteRT can read ({error})") from None
        signature = metadata.tensors["signature"]
        if signature not in self.model.signatures():
            raise ExportError(
                f"{metadata.directory / METADATA_NAME}: tensors: the model has no signature {signature!r}"
            )
        _check_shapes(metadata, self.model.input_shapes(signature), self.model.output_names(signature))

    def signature_caller(self):
        """See ``StepRunner.signature_caller``: an interpreter of its own over the same file (signature
        runners of one interpreter share its tensors)."""
        model = open_tflite(str(self.metadata.path("tflite")), self.threads)
        _check_transducer(self.metadata, model.signatures(), model.input_shapes, model.output_names)
        return model.run

    def step(self, windows, state):
        """See ``StepRunner.step``."""
        names = self.metadata.tensors
        inputs = {names["input"]: windows.astype(np.float32, copy=False)}
        inputs.update({spec["input"]: value for spec, value in zip(self.metadata.state, state, strict=True)})
        out = self.model.run(names["signature"], inputs)
        return out[names["logits"]][0], tuple(out[spec["output"]] for spec in self.metadata.state)

    def _utterance(self, features):
        names = self.metadata.tensors
        return self.model.run(names["signature"], {names["input"]: features})[names["logits"]][0]


def _check_shapes(metadata: ExportMetadata, inputs: dict[str, list[int]], outputs: set[str]) -> None:
    """ExportError naming metadata.json when its tensor names or geometry (n_steps, n_context, n_input,
    the state shapes) are not the model's: an edited file must not reach the interpreter."""
    names = metadata.tensors
    source = metadata.directory / METADATA_NAME
    streaming = metadata.streaming
    if streaming is None:  # a whole utterance: [1, any time, n_input]
        expected = {names.get("input"): [1, -1, metadata.n_input]}
    elif streaming.frames:
        expected = {names.get("input"): [1, streaming.width, metadata.n_input]}
    else:
        expected = {names.get("input"): [1, metadata.n_steps, 2 * metadata.n_context + 1, metadata.n_input]}
    expected.update({spec["input"]: list(spec["shape"]) for spec in metadata.state})
    for name, shape in expected.items():
        if name not in inputs:
            raise ExportError(f"{source}: tensors: the model has no input {name!r}")
        if inputs[name] != shape:
            raise ExportError(
                f"{source}: tensors: the model's input {name!r} is shaped {inputs[name]}, the metadata "
                f"says {shape} (n_steps, n_context, n_input or a state shape was edited)"
            )
    for name in [names.get("logits")] + [spec["output"] for spec in metadata.state]:
        if name not in outputs:
            raise ExportError(f"{source}: tensors: the model has no output {name!r}")


def _check_transducer(metadata: ExportMetadata, signatures: set[str], input_shapes, output_names) -> None:
    """ExportError naming metadata.json's ``transducer`` key whose signature, tensor name or size
    (``context_size``, ``joint_dim``) is not the model's: an edited file must not reach a search.
    ``input_shapes(signature)``: each input's shape, -1 for any size; ``output_names(signature)``."""
    spec, source = metadata.transducer, metadata.directory / METADATA_NAME
    expected = {
        "predict": ({"input": [-1, spec.context_size]}, ("output",)),
        "join": ({"frames": [-1, spec.joint_dim], "predicted": [-1, spec.joint_dim]}, ("output",)),
    }
    for part, (inputs, outputs) in expected.items():
        names = getattr(spec, part)
        signature = names["signature"]
        if signature not in signatures:
            raise ExportError(
                f"{source}: transducer.{part}.signature: the model has no signature {signature!r}"
            )
        shapes = input_shapes(signature)
        for key, shape in inputs.items():
            if names[key] not in shapes:
                raise ExportError(
                    f"{source}: transducer.{part}.{key}: {signature} has no input {names[key]!r}"
                )
            if shapes[names[key]] != shape:
                raise ExportError(
                    f"{source}: transducer.{part}.{key}: {names[key]!r} is shaped {shapes[names[key]]}, the "
                    f"metadata says {shape} (context_size or joint_dim was edited)"
                )
        for key in outputs:
            if names[key] not in output_names(signature):
                raise ExportError(
                    f"{source}: transducer.{part}.{key}: {signature} has no output {names[key]!r}"
                )


class SavedModelRunner(StepRunner):
    """The SavedModel's streaming signature through TensorFlow."""

    backend = "saved_model"

    def __init__(self, metadata: ExportMetadata, threads: int = 1):
        super().__init__(metadata)
        import tensorflow as tf

        _limit_tf_threads(tf, threads)
        self.loaded = tf.saved_model.load(str(metadata.path("saved_model")))
        self.function = self.loaded.signatures[metadata.tensors["signature"]]

    def signature_caller(self):
        """See ``StepRunner.signature_caller`` (TensorFlow's functions may be called from any thread)."""
        signatures = self.loaded.signatures

        def input_shapes(signature: str) -> dict[str, list[int]]:
            specs = signatures[signature].structured_input_signature[1]
            return {
                name: [-1 if n is None else n for n in spec.shape.as_list()] for name, spec in specs.items()
            }

        def output_names(signature: str) -> set[str]:
            return set(signatures[signature].structured_outputs)

        _check_transducer(self.metadata, set(signatures), input_shapes, output_names)

        def call(signature: str, inputs: dict) -> dict:
            return {name: value.numpy() for name, value in signatures[signature](**inputs).items()}

        return call

    def step(self, windows, state):
        """See ``StepRunner.step``."""
        names, specs = self.metadata.tensors, self.metadata.state
        inputs = {names["input"]: windows.astype(np.float32, copy=False)}
        inputs.update({spec["input"]: value for spec, value in zip(specs, state, strict=True)})
        out = self.function(**inputs)
        return out[names["logits"]].numpy()[0], tuple(out[spec["output"]].numpy() for spec in specs)

    def _utterance(self, features):
        names = self.metadata.tensors
        return self.function(**{names["input"]: features})[names["logits"]].numpy()[0]


class FrozenGraphRunner(StepRunner):
    """The frozen GraphDef (``output_graph.pb``) through TensorFlow."""

    backend = "frozen_graph"

    def __init__(self, metadata: ExportMetadata, threads: int = 1):
        super().__init__(metadata)
        import tensorflow as tf

        _limit_tf_threads(tf, threads)
        self._tf = tf
        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(metadata.path("frozen_graph").read_bytes())
        inputs, outputs = _frozen_names(metadata.raw["frozen_graph"])
        wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
        graph = wrapped.graph
        self.function = wrapped.prune(
            [graph.as_graph_element(name) for name in inputs],
            [graph.as_graph_element(name) for name in outputs],
        )

    def step(self, windows, state):
        """See ``StepRunner.step``."""
        tf = self._tf
        logits, *new_state = self.function(tf.constant(windows, tf.float32), *(tf.constant(s) for s in state))
        return logits.numpy()[0], tuple(s.numpy() for s in new_state)

    def _utterance(self, features):
        return self.function(self._tf.constant(features, self._tf.float32))[0].numpy()[0]


class OnnxRunner(StepRunner):
    """``model.onnx`` (``export.onnx``) through onnxruntime (the ``onnx`` extra)."""

    backend = "onnx"

    def __init__(self, metadata: ExportMetadata, threads: int = 1):
        super().__init__(metadata)
        try:
            import onnxruntime
        except ImportError:
            raise ExportError(
                "the onnx backend needs onnxruntime, which is not installed "
                "(pip install onnxruntime==1.31.1, or the project's onnx extra)"
            ) from None
        path = metadata.path("onnx")
        if not path.is_file():
            raise ExportError(f"{path}: ONNX model missing from the export")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._outputs = [metadata.tensors["logits"], *(spec["output"] for spec in metadata.state)]

    def step(self, windows, state):
        """See ``StepRunner.step``."""
        feeds = {self.metadata.tensors["input"]: windows.astype(np.float32, copy=False)}
        feeds.update({spec["input"]: value for spec, value in zip(self.metadata.state, state, strict=True)})
        logits, *new_state = self.session.run(self._outputs, feeds)
        return logits[0], tuple(new_state)


def _frozen_names(entry: dict) -> tuple[list[str], list[str]]:
    """Graph tensor names (input, then the state) and (logits, then the new state) of a frozen graph;
    format 1 exports named an LSTM's two tensors in a mapping."""
    if isinstance(entry["inputs"], dict):
        return (
            [entry["inputs"][k] for k in ("input", "state_h", "state_c")],
            [entry["outputs"][k] for k in ("logits", "new_state_h", "new_state_c")],
        )
    return list(entry["inputs"]), list(entry["outputs"])


def _limit_tf_threads(tf, threads: int) -> None:
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # TensorFlow already started; keep its settings
        pass


def make_runner(metadata: ExportMetadata, backend: str = "tflite", threads: int = 1) -> StepRunner:
    """The runner for ``backend`` (one of BACKENDS)."""
    runners = {
        "tflite": TFLiteRunner,
        "saved_model": SavedModelRunner,
        "frozen_graph": FrozenGraphRunner,
        "onnx": OnnxRunner,
    }
    if backend not in runners:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return runners[backend](metadata, threads)
