"""Keep TensorFlow's start-up chatter off the terminal."""

from __future__ import annotations

import os
import re
import sys
import tempfile

# What TensorFlow 2.21 writes to stderr while it loads, before it reads TF_CPP_MIN_LOG_LEVEL.
NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called|[IW]\d{4} \d\d:\d\d:\d\d"
    r"|To enable the following instructions|INFO: Created TensorFlow Lite XNNPACK delegate)"
)


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with its start-up lines (oneDNN, CPU features) filtered out of stderr, unless
    ``TF_CPP_MIN_LOG_LEVEL`` is unset or 0 (asking for them). Written by hand because TensorFlow logs
    them before its own log-level setting applies; other stderr lines of the import are passed on."""
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0":
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        for line in captured.read().decode(errors="replace").splitlines():
            if line.strip() and not NOISE.match(line):
                print(line, file=sys.stderr)
