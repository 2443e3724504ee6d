"""DeepSpeech 0.7-0.9 and Coqui STT ``.tflite`` models, run by this client as their native client runs them.

Such a file is recognised by its outputs: ``logits``, ``new_state_c``/``_h``, ``mfccs``
and the constant ``metadata_*`` tensors (version, sample rate, feature window and
step in ms, beam width, the serialised alphabet, optionally a language). This module
reads them and describes the model as an ``ExportMetadata`` (the ``deepspeech``
front end with its ``final_window``, no normalisation, the context and batch of the
``input_node`` shape, the LSTM state), with a ``StepRunner`` over the interpreter, so
that ``Model``, ``Stream``, the decoders and the CLI serve it unchanged:

- 16-bit samples scaled by 1/32768, 32 ms windows every 20 ms through TensorFlow's
  AudioSpectrogram + Mfcc (``native_client.frontends.deepspeech``, checked at load
  against the model's own ``mfccs`` output; computing features through the model
  itself would run the whole acoustic model once per 20 ms window, as Python's
  interpreter cannot restrict ``invoke`` to a subgraph);
- ``n_context`` zero frames before the first frame and after the last, the samples
  after the last whole window as one more zero-padded frame (the native client's
  flush), ``n_steps`` windows per call with the LSTM state carried;
- their ``logits`` output is already softmaxed: the runner hands the decoders its
  logarithm, which is a valid logit vector of the same distribution (softmax of log p is p), so greedy and
  beam search, confidences and word timings need no change.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from native_client.alphabet import Alphabet, AlphabetError
from native_client.frontends import FeaturePipeline
from native_client.frontends.deepspeech import DeepSpeechFrontEnd, DeepSpeechSettings
from native_client.litert import tflite_interpreter
from native_client.metadata import ExportError, ExportMetadata, StreamInput, StreamSpec
from native_client.runtime import StepRunner

FORMAT = "deepspeech-tflite"
INPUT, LOGITS, SAMPLES, MFCCS = "input_node", "logits", "input_samples", "mfccs"
STATE = (("previous_state_h", "new_state_h"), ("previous_state_c", "new_state_c"))
METADATA = ("version", "sample_rate", "feature_win_len", "feature_win_step", "beam_width", "alphabet")
# The oldest graph version with these metadata outputs (DeepSpeech 0.7); the native client refuses older ones.
MIN_VERSION = 6
# Differences between the model's MFCC subgraph and ours above this mean other features: refuse the model.
MFCC_TOLERANCE = 1e-3


def _output_names(interpreter) -> set[str]:
    return {detail["name"] for detail in interpreter.get_output_details()}


def is_deepspeech_tflite(path: str | Path) -> bool:
    """True for a ``.tflite`` file with DeepSpeech's metadata outputs (reads the flatbuffer's tensor table
    only; nothing is allocated)."""
    path = Path(path)
    if not (path.is_file() and path.suffix == ".tflite"):
        return False
    try:
        interpreter = tflite_interpreter(str(path), 1)
    except ValueError:  # not a flatbuffer LiteRT reads
        return False
    return {LOGITS, *(f"metadata_{name}" for name in METADATA)} <= _output_names(interpreter)


def deserialize_alphabet(data: bytes, source: str) -> Alphabet:
    """DeepSpeech's serialised alphabet: a uint16 count, then per label a uint16 index, a uint16 byte length
    and that many UTF-8 bytes (little-endian, as every platform they shipped for writes it)."""
    labels: dict[int, str] = {}
    try:
        (count,) = struct.unpack_from("<H", data, 0)
        offset = 2
        for _ in range(count):
            index, length = struct.unpack_from("<HH", data, offset)
            offset += 4
            if offset + length > len(data):
                raise struct.error("label runs past the end")
            labels[index] = data[offset : offset + length].decode("utf-8")
            offset += length
    except (struct.error, UnicodeDecodeError) as error:
        raise ExportError(f"{source}: metadata_alphabet is not a serialised alphabet ({error})") from None
    if sorted(labels) != list(range(len(labels))):
        raise ExportError(f"{source}: metadata_alphabet: label indices are not 0..{len(labels) - 1}")
    try:
        return Alphabet(tuple(labels[i] for i in range(len(labels))))
    except AlphabetError as error:
        raise ExportError(
            f"{source}: metadata_alphabet: {error} (models with multi-character or byte labels, e.g. Coqui's "
            f"bytes output mode, are not supported)"
        ) from None


class DeepSpeechTFLiteRunner(StepRunner):
    """A DeepSpeech/Coqui ``.tflite`` model: reads its metadata into ``self.metadata`` and runs its acoustic
    model ``n_steps`` windows at a time. ``step`` returns log-probabilities (the output is softmaxed)."""

    def __init__(self, path: str | Path, threads: int = 1):
        self.path = Path(path)
        self.interpreter = tflite_interpreter(str(self.path), threads)
        self.interpreter.allocate_tensors()
        self._inputs = {d["name"]: d for d in self.interpreter.get_input_details()}
        self._outputs = {d["name"]: d for d in self.interpreter.get_output_details()}
        missing = [
            n
            for n in (INPUT, *(s for pair in STATE for s in pair), LOGITS)
            if n not in {**self._inputs, **self._outputs}
        ]
        if missing:
            raise ExportError(f"{self.path}: not a DeepSpeech/Coqui model: no {', '.join(missing)} tensor")
        super().__init__(self._read_metadata())

    def _read_metadata(self) -> ExportMetadata:
        """Run the graph once (the metadata constants, the MFCC subgraph on a test window); describe it."""
        source = str(self.path)
        probe = np.random.default_rng(0).normal(0, 3000, 4096).clip(-32768, 32767).astype(np.int16)
        has_mfcc = SAMPLES in self._inputs and MFCCS in self._outputs
        if has_mfcc:
            window = int(self._inputs[SAMPLES]["shape"][0])
            self.interpreter.set_tensor(
                self._inputs[SAMPLES]["index"], probe[:window].astype(np.float32) / 32768
            )
        self.interpreter.invoke()
        value = {
            name: self.interpreter.get_tensor(self._outputs[f"metadata_{name}"]["index"]) for name in METADATA
        }
        version = int(value["version"][0])
        if version < MIN_VERSION:
            raise ExportError(
                f"{source}: graph version {version}; DeepSpeech/Coqui models of version "
                f"{MIN_VERSION} (DeepSpeech 0.7) and later are supported"
            )
        sample_rate = int(value["sample_rate"][0])
        alphabet = deserialize_alphabet(bytes(value["alphabet"][0]), source)
        _, n_steps, window, n_input = (int(n) for n in self._inputs[INPUT]["shape"])
        n_classes = int(self._outputs[LOGITS]["shape"][-1])
        if n_classes != alphabet.n_classes:
            raise ExportError(
                f"{source}: logits has {n_classes} classes, the alphabet {alphabet.size} labels + blank"
            )
        settings = DeepSpeechSettings(
            numcep=n_input,
            winlen=int(value["feature_win_len"][0]) / 1000,
            winstep=int(value["feature_win_step"][0]) / 1000,
            final_window=True,
        )
        try:
            frontend = DeepSpeechFrontEnd(settings, sample_rate)
        except ValueError as error:
            raise ExportError(
                f"{source}: its feature settings do not fit TensorFlow's ops: {error}"
            ) from None
        if has_mfcc:
            theirs = self.interpreter.get_tensor(self._outputs[MFCCS]["index"]).reshape(-1)
            ours = frontend.frames(probe[: frontend.frame_length])[0]
            if theirs.shape != ours.shape or not np.allclose(theirs, ours, rtol=0, atol=MFCC_TOLERANCE):
                raise ExportError(
                    f"{source}: its MFCC subgraph computes other features than TensorFlow's "
                    f"AudioSpectrogram + Mfcc with DeepSpeech's settings; not supported"
                )
        state_shape = [int(n) for n in self._inputs[STATE[0][0]]["shape"]]
        language = (
            bytes(self.interpreter.get_tensor(self._outputs["metadata_language"]["index"])[0]).decode(
                "utf-8", "replace"
            )
            if "metadata_language" in self._outputs
            else ""
        )
        raw = {
            "format": FORMAT,
            "graph_version": version,
            "sample_rate": sample_rate,
            "feature_win_len_ms": int(value["feature_win_len"][0]),
            "feature_win_step_ms": int(value["feature_win_step"][0]),
            "language": "" if language.startswith("<") else language,
        }
        return ExportMetadata(
            directory=self.path.parent,
            model_version=version,
            fingerprint="",
            features=FeaturePipeline(frontend, normalize=False, type_name=frontend.name),
            n_context=(window - 1) // 2,
            streaming=StreamSpec(StreamInput.WINDOWS, chunk=n_steps, context=(window - 1) // 2),
            n_input=n_input,
            n_steps=n_steps,
            n_classes=n_classes,
            alphabet=alphabet,
            files={"tflite": self.path.name},
            tensors={
                "input": INPUT,
                "logits": LOGITS,
                "state": [{"input": i, "output": o, "shape": state_shape} for i, o in STATE],
            },
            tflite_quantized=any(d["dtype"] == np.int8 for d in self.interpreter.get_tensor_details()),
            decoder={"beam_width": int(value["beam_width"][0])},
            raw=raw,
        )

    def step(self, windows, state):
        """See ``StepRunner.step``; the logits are ``log`` of the model's probabilities."""
        interpreter = self.interpreter
        interpreter.set_tensor(self._inputs[INPUT]["index"], windows.astype(np.float32, copy=False))
        for spec, value in zip(self.metadata.state, state, strict=True):
            interpreter.set_tensor(self._inputs[spec["input"]]["index"], value)
        interpreter.invoke()
        probabilities = interpreter.get_tensor(self._outputs[LOGITS]["index"]).reshape(
            self.metadata.n_steps, -1
        )
        logits = np.log(np.maximum(probabilities, np.finfo(np.float32).tiny))
        return logits, tuple(
            interpreter.get_tensor(self._outputs[s["output"]]["index"]) for s in self.metadata.state
        )
