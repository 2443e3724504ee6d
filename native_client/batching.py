"""Many streams, one model call: runners that step a batch of streams' chunks.

The chunks are ``native_client.stream.Utterance``'s (the client's ``Stream`` runs the same ones), so a
scheduler (``native_client.server.engine``) can put the chunks of many utterances into one call and get
the client's logits chunk for chunk.

``batch_runner`` picks how a batch is run: the export's batched streaming signature
(``tensors["batch_signature"]``: the inputs of one call for each stream, windows ``[batch, n_steps, window,
n_input]`` or frames ``[batch, lookback + chunk + lookahead, n_input]``, each state ``[batch, ...]``)
through TFLite or the SavedModel, or, for a model without one (older exports, the frozen graph,
DeepSpeech/Coqui ``.tflite`` files), one batch-1 call per stream.
"""

from __future__ import annotations

import numpy as np

from native_client.litert import InterpreterModel
from native_client.runtime import SavedModelRunner, StepRunner, TFLiteRunner


class BatchRunner:
    """Steps several streams at once: ``step(inputs [batch, ...], states)`` (one call's input of each
    stream: windows or frames) with one state tuple per stream; returns logits ``[batch, labels,
    n_classes]`` and the new state tuples.
    This base class makes one batch-1 call per stream (models without a batched signature)."""

    batched = False

    def __init__(self, runner: StepRunner):
        self.runner = runner
        self.metadata = runner.metadata

    def step(self, windows: np.ndarray, states: list[tuple]) -> tuple[np.ndarray, list[tuple]]:
        """See the class docstring."""
        logits, new_states = [], []
        for row, state in zip(windows, states, strict=True):
            out, new_state = self.runner.step(row[None], state)
            logits.append(out)
            new_states.append(new_state)
        return np.stack(logits), new_states


def _bucket(batch: int) -> int:
    """The batch size a call is padded to: a power of two, so that a batch of any size reuses one of a
    few tensor allocations (a TFLite resize reallocates every tensor)."""
    return 1 << max(0, batch - 1).bit_length()


class _SignatureBatchRunner(BatchRunner):
    """The batched streaming signature (``tensors["batch_signature"]``) of a TFLite or SavedModel export."""

    batched = True

    def __init__(self, runner: StepRunner, call):
        super().__init__(runner)
        self._call = call

    def step(self, windows, states):
        """See ``BatchRunner``."""
        names, specs = self.metadata.tensors, self.metadata.state
        batch = len(windows)
        size = _bucket(batch)
        if size > batch:
            windows = np.concatenate([windows, np.zeros((size - batch,) + windows.shape[1:], np.float32)])
        inputs = {names["input"]: np.ascontiguousarray(windows, dtype=np.float32)}
        for index, spec in enumerate(specs):
            rows = [state[index] for state in states]
            rows.extend(np.zeros_like(rows[0]) for _ in range(size - batch))
            inputs[spec["input"]] = np.concatenate(rows)
        out = self._call(inputs)
        logits = np.asarray(out[names["logits"]])[:batch]
        new = [np.asarray(out[spec["output"]]) for spec in specs]
        return logits, [tuple(value[i : i + 1].copy() for value in new) for i in range(batch)]


def batch_runner(runner: StepRunner) -> BatchRunner:
    """The runner for batches of streams on ``runner``'s model: its batched signature when the export has
    one and the backend runs it (TFLite, SavedModel), else one batch-1 call per stream."""
    signature = runner.metadata.tensors.get("batch_signature")
    if signature and isinstance(runner, TFLiteRunner) and signature in runner.model.signatures():
        # A model of its own in LiteRT's Interpreter: the shared-weights model resizes its inputs at every
        # change of batch size, which costs far more there (bench/serve.py: 80 real-time streams against
        # 144 through the Interpreter). The price is a second packed copy of the weights in the server.
        model = InterpreterModel(str(runner.metadata.path("tflite")), runner.threads)
        return _SignatureBatchRunner(runner, lambda inputs: model.run(signature, inputs))
    if signature and isinstance(runner, SavedModelRunner) and signature in runner.loaded.signatures:
        function = runner.loaded.signatures[signature]
        return _SignatureBatchRunner(
            runner, lambda inputs: {k: v.numpy() for k, v in function(**inputs).items()}
        )
    return BatchRunner(runner)
