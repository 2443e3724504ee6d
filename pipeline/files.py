"""Atomic file writes (beside the target under a temporary name, then renamed), atomic directory
replacement, and removal of the temporaries killed runs left behind."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends normally, rename it onto ``path``.

    Readers see the old file or the whole new one, never a part. When the block
    raises, the temporary file is removed and ``path`` is left as it was.
    ``suffix`` ends the temporary name (for writers that insist on an extension).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


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


def replace_directory(new: Path, destination: Path) -> None:
    """Put directory ``new`` at ``destination``, removing what was there. Where the system allows it the
    two are exchanged in one step, so ``destination`` is never missing; elsewhere the old directory is
    moved aside first (a short gap)."""
    new, destination = Path(new), Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    if not destination.exists():
        os.replace(new, destination)
        return
    if _exchange(new, destination):
        shutil.rmtree(new, ignore_errors=True)  # ``new`` now holds the old directory
        return
    old = destination.with_name(f".{destination.name}.old-{os.getpid()}")
    os.replace(destination, old)
    os.replace(new, destination)
    shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != 0


def remove_leftovers(directory: Path, patterns: tuple[str, ...]) -> list[Path]:
    """Remove entries of ``directory`` matching one of ``patterns`` (regular expressions whose group
    ``pid`` is the writer's process id) whose writer is no longer running: the temporary files and
    directories of killed runs. Returns what was removed."""
    directory = Path(directory)
    removed = []
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        for pattern in patterns:
            match = re.fullmatch(pattern, entry.name)
            if match and not _alive(int(match.group("pid"))):
                shutil.rmtree(
                    entry, ignore_errors=True
                ) if entry.is_dir() and not entry.is_symlink() else entry.unlink(missing_ok=True)
                removed.append(entry)
                break
    if removed:
        log.info("Removed leftovers of killed runs: %s", ", ".join(str(p) for p in removed))
    return removed
