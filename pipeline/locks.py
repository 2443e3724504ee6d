"""Inter-process locks on stage outputs, so that two pipelines sharing a stage never write it at once.

The locks are ``flock``s: the kernel releases one when its holder dies, so a killed run never leaves a
stale lock, and on NFS (Linux clients send ``flock`` to the server as a POSIX lock) they hold across
machines. A lock held means a live writer: leftovers covered by a lock the caller holds are known dead
(``files.remove_leftovers``), and an output whose lock someone else holds is in use (``in_use``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

# The lock file of an output locked from inside (a directory that may be a mount point, whose parent
# may not be writable): ``<output>/.lock``.
INSIDE = ".lock"


def lock_path(output: str | Path, inside: bool = False) -> Path:
    """The lock file of ``output``: ``<output>.lock`` beside it, or ``<output>/.lock`` when ``inside``."""
    return Path(output) / INSIDE if inside else Path(f"{output}.lock")


@contextlib.contextmanager
def stage_lock(output: str | Path, inside: bool = False):
    """Hold an exclusive ``flock`` on ``output``'s lock file (``lock_path``) for the block; waits while
    another process holds it. ``inside``: the lock lives in the directory ``output`` (which must exist).

    The kernel releases the lock when its holder dies, so a killed run never
    leaves a stale lock behind. Works across processes on one machine (and on
    NFS with lock support).
    """
    path = lock_path(output, inside)
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


def held(lock: str | Path) -> bool:
    """Whether another process holds the ``flock`` of lock file ``lock`` (False when there is none)."""
    try:
        handle = open(lock, "rb")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def in_use(output: str | Path) -> Path | None:
    """The lock file by which a live process holds ``output`` (beside it or inside it), or None."""
    for lock in (lock_path(output), lock_path(output, inside=True)):
        if held(lock):
            return lock
    return None
