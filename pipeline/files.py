"""Atomic file writes (beside the target under a temporary name, synced, then renamed), publishing a
directory's entries one atomic step each, and removal of the temporaries killed runs left behind.

Temporary names carry the writer's host and process id (``writer_tag``): on a work directory shared by
several machines (NFS, containers), a process id says nothing about another host's processes, so a
leftover is removed only when its writer is known to be gone: it ran on this host and its process is
not running, or the caller holds the lock every writer of that leftover holds (``locks.stage_lock``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# fsync errors that mean "this file system does not sync that", not a failed write.
_UNSYNCABLE = (errno.EINVAL, errno.ENOTSUP, errno.EBADF)


def host_name() -> str:
    """This machine's name as it appears in temporary names (letters, digits, ``_`` and ``-`` only)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:63] or "host"


def writer_tag() -> str:
    """``<host>-<pid>``: who writes a temporary file, told apart across machines sharing a directory."""
    return f"{host_name()}-{os.getpid()}"


def fsync_path(path: str | Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk, so that a rename after it can never
    leave an empty or partial file under the final name after a power loss."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except IsADirectoryError:  # pragma: no cover - O_RDONLY opens directories on Linux
        return
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in _UNSYNCABLE:
            raise
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """``fsync_path`` every file and directory below ``root`` and ``root`` itself (a staged export)."""
    root = Path(root)
    if not root.is_dir():
        fsync_path(root)
        return
    for folder, _, names in os.walk(root, topdown=False):
        for name in names:
            entry = Path(folder) / name
            if not entry.is_symlink():
                fsync_path(entry)
        fsync_path(folder)


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends normally, rename it onto ``path``.

    Readers see the old file or the whole new one, never a part, also after a power
    loss (the file is synced before the rename, its folder after). When the block
    raises, the temporary file is removed and ``path`` is left as it was.
    ``suffix`` ends the temporary name (for writers that insist on an extension).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{writer_tag()}.tmp{suffix}")
    try:
        yield tmp
        fsync_tree(tmp)  # the data first: a rename may reach the disk before unsynced data does
        os.replace(tmp, path)
        fsync_path(path.parent)  # then the rename itself
    finally:
        if tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see ``atomic_path``)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, data) -> None:
    """Write ``data`` as indented JSON, atomically."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


RENAME_EXCHANGE = 2
AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step with Linux ``renameat2(RENAME_EXCHANGE)``; False where the system or
    the file system cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(second))


def _move_entry(source: Path, destination: Path) -> None:
    """Put ``source`` at ``destination`` in one step: exchanged with what is there (``source`` then holds
    the old entry) or renamed when nothing is. Where the file system cannot exchange, a file replaces the
    old one in one rename and a directory moves the old one aside first (a gap of two renames)."""
    if not os.path.lexists(destination):
        os.rename(source, destination)
        return
    if _exchange(source, destination):
        return
    if not destination.is_dir() or destination.is_symlink():
        os.replace(source, destination)  # the old file is unlinked by the rename itself
        return
    aside = source.with_name(source.name + ".old")
    os.rename(destination, aside)
    os.rename(source, destination)
    os.rename(aside, source)


def replace_directory(new: Path, destination: Path) -> None:
    """Put directory ``new`` at ``destination`` (a folder this project owns whole, such as an import),
    removing what was there. ``new`` is synced first; where the system allows it the two are exchanged in
    one step, so ``destination`` is never missing; elsewhere the old directory is moved aside first (a
    short gap). Exports never come here: they publish entry by entry (``publish_entries``)."""
    new, destination = Path(new), Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    fsync_tree(new)
    if not destination.exists():
        os.rename(new, destination)
    elif _exchange(new, destination):
        shutil.rmtree(new, ignore_errors=True)  # ``new`` now holds the old directory
    else:
        old = destination.with_name(f".{destination.name}.old-{writer_tag()}")
        os.rename(destination, old)
        os.rename(new, destination)
        shutil.rmtree(old, ignore_errors=True)
    fsync_path(destination.parent)


def publish_entries(
    staging: Path, destination: Path, last: Iterable[str] = (), replaced: Iterable[str] = ()
) -> None:
    """Move every entry of directory ``staging`` into ``destination``, each in one atomic step, the names
    in ``last`` after the others (in that order); then remove the ``replaced`` entries of ``destination``
    that the new set does not hold. Nothing else in ``destination`` is touched, and ``destination`` itself
    is never renamed: it may hold other files (numbered versions, a user's) and may be a mount point.
    The staged files are synced before the first rename, ``destination`` after the last. ``staging``
    ends up holding the replaced entries (remove it afterwards)."""
    staging, destination = Path(staging), Path(destination)
    last = list(last)
    names = sorted(p.name for p in staging.iterdir())
    order = [n for n in names if n not in last] + [n for n in last if n in names]
    fsync_tree(staging)
    for name in order:
        _move_entry(staging / name, destination / name)
    for name in sorted(set(replaced) - set(names)):
        entry = destination / name
        if entry.is_dir() and not entry.is_symlink():
            os.rename(entry, staging / name)  # out of sight first, deleted with the staging directory
        elif os.path.lexists(entry):
            entry.unlink()
    fsync_path(destination)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != 0


def writer_gone(name: str, pattern: str) -> bool | None:
    """Whether the writer of a leftover named ``name`` is known to be gone: None when ``name`` does not
    match ``pattern`` (see ``remove_leftovers``), False when its writer lives or ran on another host."""
    match = re.fullmatch(pattern, name)
    if not match:
        return None
    return match.groupdict().get("host") in (None, host_name()) and not _alive(int(match.group("pid")))


def remove_leftovers(
    directory: Path, patterns: tuple[str, ...], locked_prefixes: tuple[str, ...] = ()
) -> list[Path]:
    """Remove entries of ``directory`` matching one of ``patterns`` (regular expressions with a group
    ``pid``, the writer's process id, and an optional group ``host``, its ``host_name``) whose writer is
    gone: the temporary files and directories of killed runs. Returns what was removed.

    A writer is known to be gone when its entry's name starts with one of ``locked_prefixes`` (the caller
    holds the lock every writer of those entries holds), or when it ran on this host (or the name
    predates host tags) and its process is not running. An entry of another host is left alone: its
    process id cannot be checked from here."""
    directory = Path(directory)
    removed = []
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        for pattern in patterns:
            if not re.fullmatch(pattern, entry.name):
                continue
            locked = bool(locked_prefixes) and entry.name.startswith(tuple(locked_prefixes))
            if locked or writer_gone(entry.name, pattern):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed.append(entry)
            break
    if removed:
        log.info("Removed leftovers of killed runs: %s", ", ".join(str(p) for p in removed))
    return removed


def removal_name(path: str | Path) -> Path:
    """The hidden name ``remove_entry`` gives ``path`` while deleting it: ``.<name>.removed-<host>-<pid>``
    (``workdir.LEFTOVER_PATTERNS`` knows it, so a killed remover's is swept up)."""
    path = Path(path)
    return path.with_name(f".{path.name}.removed-{writer_tag()}")


def remove_entry(path: str | Path) -> bool:
    """Remove a file, symlink or directory, renamed to a hidden name (``removal_name``) first so that no
    reader sees it half gone; a symlink is removed, never followed. False when there was nothing."""
    path = Path(path)
    if not os.path.lexists(path):
        return False
    doomed = removal_name(path)
    os.replace(path, doomed)
    if doomed.is_dir() and not doomed.is_symlink():
        shutil.rmtree(doomed)
    else:
        doomed.unlink()
    return True
