"""A TFLite model's signatures, called by name with numpy arrays: ``open_tflite(path, threads)``.

The streaming step of an export is run by LiteRT's ``CompiledModel`` with XNNPACK's in-memory weight cache
(``SharedWeightsModel``), not by its ``Interpreter``. The step is unrolled: each of its ``n_steps`` frames has
a ``FULLY_CONNECTED`` operator that reads the same LSTM recurrent kernel, and the batched signature reads
it again. The Interpreter hands the model to XNNPACK without a weight cache, and XNNPACK then packs a copy
of a weight for every operator that reads it: 32 copies of the full-size model's 16 MiB int8 recurrent
kernel (512 MiB; ``allocate_tensors`` took 610 MiB of the 688 MiB a long transcription peaked at), and a
batch-1 call that streams 16 different copies through the CPU's caches instead of one. The Interpreter's
Python API has no way to give XNNPACK a cache; the CompiledModel's CPU options do, and with it every
weight is packed once for all operators and signatures (the long transcription: 134 MiB). The kernels
are the same XNNPACK ones, so the outputs are equal bit for bit.

LiteRT 2.3 logs its set-up (environments, accelerators, vendor plugins it looks for) at INFO on stderr
with no setting to turn it off; what it writes while a model is compiled and first run is filtered here
(``LITERT_NOISE``). Two lines at the process's exit, when it drops the environment of its first call,
are beyond reach.

The weight cache is used for the context-window streaming step only (DeepSpeech's family, the exports
whose unrolled recurrent kernel it was made for, checked bit for bit against the Interpreter). LiteRT 2.3
with the cache computes the Conformer's batched streaming signature wrongly (its outputs differ from the
Interpreter's by up to 0.8 for the same inputs, without the cache they are equal): a defect of the cache,
so a model it has not been checked on runs through the Interpreter.

``InterpreterModel`` (the Interpreter's signature runners) serves what the compiled model does not:
signatures whose inputs change shape in more than the batch (a whole utterance's frames), and a runtime
without ``ai_edge_litert`` (TensorFlow's bundled interpreter).
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

from native_client.quiet import filtered_stderr

# LiteRT's start-up lines (environment, accelerator registry, vendor plugins it looks for and does not
# find, the XNNPACK delegate): informational, written to stderr while a model is compiled. ERROR lines pass.
LITERT_NOISE = re.compile(r"^(INFO|WARNING): (\[[\w./-]+:\d+\] |Created TensorFlow Lite XNNPACK delegate)")


def open_tflite(path: str, threads: int, shared_weights: bool = False):
    """The model at ``path`` with ``threads`` CPU threads: a ``SharedWeightsModel`` when ``shared_weights``
    (the caller knows the model is one the weight cache computes right, and no input changes more than its
    batch between calls) and LiteRT compiles it, else an ``InterpreterModel``."""
    if shared_weights:
        try:
            return SharedWeightsModel(path, threads)
        except ImportError:  # no ai_edge_litert: TensorFlow's interpreter, a copy of a weight per operator
            pass
        except RuntimeError:  # the Interpreter may still run it, or says in one line why not
            pass
    return InterpreterModel(path, threads)


def tflite_interpreter(path: str, threads: int):
    """LiteRT's ``Interpreter`` (or TensorFlow's bundled one) for ``path``, not yet allocated."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # TensorFlow's bundled interpreter does the same job
        from tensorflow.lite import Interpreter
    return Interpreter(model_path=path, num_threads=threads)


def _check_flatbuffer(path: str) -> None:
    """ValueError (LiteRT's words) unless ``path`` is a TFLite model the Interpreter can build.
    ``CompiledModel.from_file`` does not verify the flatbuffer: a truncated file crashed the process
    (SIGSEGV, nothing said). Building the Interpreter verifies it and reads every subgraph, operator and
    tensor; no delegate, no tensors allocated: a few MiB, let go at once."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    Interpreter(
        model_path=path, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )


class InterpreterModel:
    """Signatures through the Interpreter's signature runners, which resize inputs as given."""

    def __init__(self, path: str, threads: int):
        self.interpreter = tflite_interpreter(path, threads)
        self._runners: dict = {}
        self._ran: set[str] = set()

    def signatures(self) -> set[str]:
        """The model's signature names."""
        return set(self.interpreter.get_signature_list())

    def _runner(self, signature: str):
        if signature not in self._runners:
            self._runners[signature] = self.interpreter.get_signature_runner(signature)
        return self._runners[signature]

    def input_shapes(self, signature: str) -> dict[str, list[int]]:
        """Each input's shape as the model declares it (-1: any size)."""
        details = self._runner(signature).get_input_details()
        return {name: [int(v) for v in d.get("shape_signature", d["shape"])] for name, d in details.items()}

    def output_names(self, signature: str) -> set[str]:
        """The signature's output names."""
        return set(self._runner(signature).get_output_details())

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call of ``signature``; its outputs by name."""
        if signature in self._ran:
            return self._runner(signature)(**inputs)
        # the first call allocates the tensors and creates XNNPACK's delegate, which says so on stderr
        with filtered_stderr(LITERT_NOISE):
            outputs = self._runner(signature)(**inputs)
        self._ran.add(signature)
        return outputs


class _Slot:
    """The tensor buffers of one signature at one set of input shapes."""

    def __init__(self, inputs: dict, outputs: dict, arrays: dict):
        self.inputs = inputs
        self.outputs = outputs
        self.arrays = arrays  # the host memory the output buffers use: kept alive with them
        self.ran = False


def _aligned_empty(shape: list[int], dtype: np.dtype) -> np.ndarray:
    """An array at a 64-byte boundary (LiteRT copies host memory that is not, and the caller would lose
    sight of the copy)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.empty(count * dtype.itemsize + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    return raw[offset : offset + count * dtype.itemsize].view(dtype).reshape(shape)


class SharedWeightsModel:
    """Signatures through LiteRT's ``CompiledModel`` on the CPU, XNNPACK's weight cache in memory (see the
    module docstring). An input may change its first (batch) dimension between calls, as the batched
    streaming signature's do; the model is resized to it, and each batch size keeps its buffers."""

    def __init__(self, path: str, threads: int):
        from ai_edge_litert.compiled_model import CompiledModel, CpuOptions, Options
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator

        options = Options(
            hardware_accelerators=HardwareAccelerator.CPU,
            cpu_options=CpuOptions(num_threads=threads, xnnpack_weight_cache_path=":memory"),
        )
        self._slots: dict[tuple[str, int | None], _Slot] = {}
        _check_flatbuffer(path)
        with filtered_stderr(LITERT_NOISE):
            self.model = CompiledModel.from_file(path, options=options)
        self._declared = {
            signature: (
                self.model.get_input_tensor_details(signature),
                self.model.get_output_tensor_details(signature),
            )
            for signature in self.model.get_signature_list()
        }
        # Per signature: the batch its inputs are resized to, None while they keep their declared shapes.
        self._layout: dict[str, int | None] = dict.fromkeys(self._declared)

    def signatures(self) -> set[str]:
        """The model's signature names."""
        return set(self._declared)

    def input_shapes(self, signature: str) -> dict[str, list[int]]:
        """Each input's shape as the model was loaded (batch 1 for a batched signature)."""
        return {name: list(detail["shape"]) for name, detail in self._declared[signature][0].items()}

    def output_names(self, signature: str) -> set[str]:
        """The signature's output names."""
        return set(self._declared[signature][1])

    def _batch(self, signature: str, inputs: dict[str, np.ndarray]) -> int | None:
        """None when every input has its declared shape, else the batch all of them share (the one
        dimension that may differ)."""
        declared = self._declared[signature][0]
        if all(list(inputs[name].shape) == list(d["shape"]) for name, d in declared.items()):
            return None
        batches = {int(inputs[name].shape[0]) for name in declared}
        if len(batches) > 1 or any(
            list(inputs[n].shape[1:]) != list(d["shape"][1:]) for n, d in declared.items()
        ):
            shapes = {name: list(inputs[name].shape) for name in declared}
            raise ValueError(
                f"{signature}: inputs shaped {shapes}; the model takes "
                f"{ {name: list(d['shape']) for name, d in declared.items()} } or the same with another batch"
            )
        return batches.pop()

    def _slot(self, signature: str, inputs: dict[str, np.ndarray]) -> _Slot:
        declared_inputs, declared_outputs = self._declared[signature]
        batch = self._batch(signature, inputs)
        if self._layout[signature] != batch:
            index = self.model.get_signature_index(signature)
            for detail in declared_inputs.values():
                shape = detail["shape"] if batch is None else [batch, *detail["shape"][1:]]
                self.model.resize_input_tensor(detail["index"], shape, index)
            self._layout[signature] = batch
        key = (signature, batch)
        if key not in self._slots:
            # Output buffers of the model's own making keep the size they had before a resize (LiteRT
            # 2.3), so they are made here from host memory: each output's declared shape at this batch.
            from ai_edge_litert.tensor_buffer import TensorBuffer

            arrays = {
                name: _aligned_empty(
                    detail["shape"] if batch is None else [batch, *detail["shape"][1:]], detail["dtype"]
                )
                for name, detail in declared_outputs.items()
            }
            with filtered_stderr(LITERT_NOISE):
                self._slots[key] = _Slot(
                    {
                        name: self.model.create_input_buffer_by_name(signature, name)
                        for name in declared_inputs
                    },
                    {name: TensorBuffer.create_from_host_memory(array) for name, array in arrays.items()},
                    arrays,
                )
        return self._slots[key]

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call of ``signature``; its outputs by name (new arrays)."""
        slot = self._slot(signature, inputs)
        if slot.ran:
            return self._call(signature, slot, inputs)
        # LiteRT sets up (and logs) a runtime environment of its own when a process first reads a buffer
        with filtered_stderr(LITERT_NOISE):
            outputs = self._call(signature, slot, inputs)
        slot.ran = True
        return outputs

    def _call(self, signature: str, slot: _Slot, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, value in inputs.items():
            slot.inputs[name].write(value)
        self.model.run_by_name(signature, slot.inputs, slot.outputs)
        return {
            name: slot.outputs[name].read(array.size, array.dtype).reshape(array.shape)
            for name, array in slot.arrays.items()
        }

    def close(self) -> None:
        """Release the compiled model and its buffers (LiteRT logs its environment's end: kept quiet)."""
        with filtered_stderr(LITERT_NOISE):
            self._slots.clear()
            self.model = None

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter shutdown the modules it needs may be gone
            self.close()
