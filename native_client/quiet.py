"""Keep runtimes' start-up chatter (TensorFlow's, LiteRT's) off the terminal."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading

# What TensorFlow 2.21 writes to stderr while it loads, before it reads TF_CPP_MIN_LOG_LEVEL.
NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called|[IW]\d{4} \d\d:\d\d:\d\d"
    r"|To enable the following instructions|INFO: Created TensorFlow Lite XNNPACK delegate)"
)

# Held while fd 2 is redirected. Module-level because fd 2 is process-wide: a second thread's capture
# begun inside the first's, and ended after it, would put back the first one's capture file (deleted by
# then) as stderr for the rest of the process. Reentrant: a capture inside one on the same thread nests.
_STDERR = threading.RLock()


@contextlib.contextmanager
def filtered_stderr(noise: re.Pattern):
    """Run the body with file descriptor 2 captured; afterwards write the lines that do not match
    ``noise`` (nor continue a line that did: indented, or LiteRT's ``└``) to stderr. For libraries that
    log from C++ before (or without) any setting of ours applies; Python's ``sys.stderr`` is flushed
    first so nothing is reordered. One thread at a time: fd 2 is the process's, and two captures
    overlapping in time would restore it out of order (see ``_STDERR``). With fd 2 closed (``2>&-``) there
    is nothing to keep off a terminal, and without a file to capture into (``_capture_file``) nothing to
    filter with: the body runs as it is."""
    captured = None if sys.stderr is None or not _is_open(2) else _capture_file()
    if captured is None:
        yield
        return
    with _STDERR, captured:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            dropping = False
            for line in captured.read().decode(errors="replace").splitlines():
                dropping = bool(noise.match(line)) or (dropping and line[:1] in (" ", "\t", "└"))
                if line.strip() and not dropping:
                    print(line, file=sys.stderr)


def _capture_file():
    """A file to capture fd 2 into: in memory where the system has ``memfd_create`` (Linux), so that a
    read-only file system (a container's, with no writable temporary directory) still has one; else a
    temporary file; None when neither can be made."""
    with contextlib.suppress(AttributeError, OSError):
        return open(os.memfd_create("stderr"), "w+b")  # noqa: SIM115 (the caller closes it)
    with contextlib.suppress(OSError):
        return tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it)
    return None


def _is_open(descriptor: int) -> bool:
    try:
        os.fstat(descriptor)
    except OSError:
        return False
    return True


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with its start-up lines (oneDNN, CPU features) filtered out of stderr, unless
    ``TF_CPP_MIN_LOG_LEVEL`` is unset or 0 (asking for them). Written by hand because TensorFlow logs
    them before its own log-level setting applies; other stderr lines of the import are passed on."""
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0":
        return
    with filtered_stderr(NOISE):
        import tensorflow  # noqa: F401


def quiet_exit(code: int) -> int:
    """``code``, once stdout and stderr are flushed and file descriptor 2 points at ``/dev/null``: LiteRT's
    runtime writes lines (``DestroyAccelerator``) from C++ destructors that run after Python has finished,
    with no setting to turn them off. For a command's entry point, after everything it says is said."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    return code
