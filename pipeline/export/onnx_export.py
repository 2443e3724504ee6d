"""``model.onnx`` (``export.onnx``): the SavedModel's streaming signature converted by tf2onnx.

tf2onnx (the ``onnx`` extra) converts whatever the family's streaming step is,
from the SavedModel the export has just written, so every model family with a
streaming form gets an ONNX model without an ONNX writer of its own. Its
command line (``python -m tf2onnx.convert``) is its public interface; it runs in
a child process, which also keeps its TensorFlow graph rewriting out of the
export's process. The model stays float: its logits equal the SavedModel's to
float rounding (docs/CLIENT.md "ONNX").
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from pipeline.export.inference_graph import SIGNATURE

# ONNX operator set: onnxruntime 1.16 and later run it (sherpa-onnx and other onnxruntime hosts too).
OPSET = 17


def check_converter() -> None:
    """RuntimeError in one line unless tf2onnx is installed (before the export does any work)."""
    if importlib.util.find_spec("tf2onnx") is None or importlib.util.find_spec("onnx") is None:
        raise RuntimeError(
            "export.onnx: tf2onnx and onnx are not installed; pip install -e '.[onnx]' "
            "(or set export.onnx: false)"
        )


def write_onnx(saved_model: Path, path: Path) -> None:
    """Convert the streaming signature of ``saved_model`` to ``path``: inputs ``input_node`` and the state
    (``previous_state_c``/``_h`` for DeepSpeech), outputs ``logits`` and the new state, batch 1, float.
    RuntimeError naming the SavedModel and tf2onnx's last message when the conversion fails."""
    check_converter()
    command = [
        sys.executable,
        "-m",
        "tf2onnx.convert",
        "--saved-model",
        str(saved_model),
        "--tag",
        "serve",
        "--signature_def",
        SIGNATURE,
        "--opset",
        str(OPSET),
        "--output",
        str(path),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 or not path.is_file():
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        raise RuntimeError(
            f"{saved_model}: tf2onnx could not convert the {SIGNATURE!r} signature: "
            f"{lines[-1] if lines else f'exit status {result.returncode}'}"
        )
