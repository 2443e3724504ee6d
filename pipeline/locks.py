"""Inter-process locks on stage outputs, so that two pipelines sharing a stage never write it at once."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stage_lock(output: str | Path):
    """Hold an exclusive ``flock`` on ``<output>.lock`` for the block; waits while another process holds it.

    The kernel releases the lock when its holder dies, so a killed run never
    leaves a stale lock behind. Works across processes on one machine (and on
    NFS with lock support).
    """
    path = Path(f"{output}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s is being written by another process; waiting for it", output)
            started = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            log.info("Waited %.0f s for %s", time.monotonic() - started, output)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
