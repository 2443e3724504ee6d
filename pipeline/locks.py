"""Inter-process locks on stage outputs, so that two pipelines sharing a stage never write it at once.

The locks are ``flock``s: the kernel releases one when its holder dies, so a killed run never leaves a
stale lock, and on NFS (Linux clients send ``flock`` to the server as a POSIX lock) they hold across
machines. A lock held means a live writer: leftovers covered by a lock the caller holds are known dead
(``files.remove_leftovers``), and an output whose lock someone else holds is in use (``in_use``). A stage
holds the locks of the outputs it reads shared (``shared_locks``), so they are in use while it runs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from collections.abc import Iterable
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
    NFS with lock support). A lock file may be removed by whoever holds it
    (``gc`` does, with the output it guards): after taking the lock, the path
    is checked to still name the file locked; if not, the one there now is locked.
    """
    path = lock_path(output, inside)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = open(path, "a")
        try:
            _lock_waiting(handle, output)
        except BaseException:
            handle.close()
            raise
        if _names(path, handle):
            break
        handle.close()  # removed (or replaced) while we waited: that inode guards nothing any more
    with handle:
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_waiting(handle, output) -> None:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("%s is being written by another process; waiting for it", output)
        started = time.monotonic()
        fcntl.flock(handle, fcntl.LOCK_EX)
        log.info("Waited %.0f s for %s", time.monotonic() - started, output)


def _names(path: Path, handle) -> bool:
    """Whether ``path`` still names the file ``handle`` has open."""
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(handle.fileno())
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


@contextlib.contextmanager
def try_locks(locks: Iterable[str | Path]):
    """Take an exclusive ``flock`` on every lock file of ``locks`` without waiting (creating the missing
    ones), in a stable order; yield True with all of them held for the block, or False (none held) when
    a live process holds one. A holder may remove its lock files inside the block (``stage_lock``
    then locks the new file a starting stage makes, never the removed one)."""
    stack = contextlib.ExitStack()
    taken = True
    with stack:
        for lock in sorted({Path(p) for p in locks}):
            handle = stack.enter_context(open(lock, "a"))
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                taken = False
            # a lock file another remover took away since we opened it guards nothing
            if not taken or not _names(lock, handle):
                taken = False
                break
        if not taken:
            stack.close()
        yield taken


class LockBusy(RuntimeError):
    """A lock ``shared_locks`` was not to wait for is held by a writer (``holder``: its pid, if known)."""

    def __init__(self, lock: Path, holder: str):
        super().__init__(f"{lock} is held by a writer{f' (pid {holder})' if holder else ''}")
        self.lock = lock
        self.holder = holder


def _open_shared(lock: Path):
    """``lock`` opened for a shared ``flock``: read-write where it may be (NFS's emulation of ``flock``
    wants it), read-only in a folder or file this user cannot write; None (with a warning) when it cannot
    be opened at all, and the output is read unlocked."""
    try:
        return open(lock, "a+")
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            log.warning("cannot lock %s (%s): reading its output unlocked", lock, error.strerror)
            return None
    try:
        return open(lock)
    except OSError as error:
        log.warning("cannot lock %s (%s): reading its output unlocked", lock, error.strerror)
        return None


def _holder(lock: Path) -> str:
    """The pid the last writer of ``lock`` wrote into it (``stage_lock``), or ""."""
    try:
        lines = Path(lock).read_text().split()
    except OSError:
        return ""
    return lines[-1] if lines else ""


@contextlib.contextmanager
def shared_locks(locks: Iterable[str | Path], wait: bool = True):
    """Hold a shared ``flock`` on every lock file of ``locks`` for the block: what a stage takes on the
    outputs it reads, so that their removers (``gc``, ``make rerun``: ``try_locks``) leave them alone
    while it runs, and its fellow readers do not. While a writer or remover holds one, wait for it, or
    raise LockBusy naming it (``wait=False``). A lock file removed meanwhile is locked anew as
    ``stage_lock`` does; a missing one is made where this user may."""
    with contextlib.ExitStack() as stack:
        for lock in sorted({Path(p) for p in locks}):
            while True:
                handle = _open_shared(lock)
                if handle is None:
                    break
                stack.enter_context(handle)
                try:
                    fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    if not wait:
                        raise LockBusy(lock, _holder(lock)) from None
                    log.info(
                        "%s is held by a writer or remover (pid %s); waiting for it", lock, _holder(lock)
                    )
                    fcntl.flock(handle, fcntl.LOCK_SH)
                if _names(lock, handle):
                    break
                handle.close()
        yield


def held(lock: str | Path) -> bool:
    """Whether another process holds the ``flock`` of lock file ``lock``, exclusive (a writer) or shared
    (a stage reading its output); False when there is none. Probed with an exclusive lock on the file
    opened read-write (NFS's ``flock`` emulation wants it); where this user may not write it, with a
    shared one, which sees writers only."""
    try:
        fd = os.open(lock, os.O_RDWR)
        probe = fcntl.LOCK_EX
    except FileNotFoundError:
        return False
    except OSError:
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            return False
        probe = fcntl.LOCK_SH
    try:
        fcntl.flock(fd, probe | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def in_use(output: str | Path) -> Path | None:
    """The lock file by which a live process holds ``output`` (beside it or inside it), or None."""
    for lock in (lock_path(output), lock_path(output, inside=True)):
        if held(lock):
            return lock
    return None
