"""File digests: SHA-256 of a file's bytes, or of a directory's files, remembered per process.

Input files (manifests, alphabet, LM corpora) are digested by streaming, and a
digest is remembered for the life of the process, keyed on path, size and
modification time: Luigi calls ``output()``/``complete()`` many times per run,
and a multi-GB LM text must not be read each time.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

DIGEST_BLOCK = 1 << 20


def _hash_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks (memory stays flat whatever the file's size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(DIGEST_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.cache
def _remembered_digest(path: str, size: int, mtime_ns: int) -> str:
    # A pure memo: the key changes whenever the file does, so a remembered digest is never stale.
    return _hash_file(Path(path))


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (remembered per process), or ``missing`` (the stage reports that)."""
    try:
        stat = os.stat(path)
        return _remembered_digest(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    except OSError:
        return "missing"


def path_digest(path: str | Path) -> str:
    """The digest of a file (``file_digest``) or of a directory's files (their relative names and
    digests, in name order); ``missing`` when there is nothing there."""
    path = Path(path)
    if not path.is_dir():
        return file_digest(path)
    digest = hashlib.sha256()
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{item.relative_to(path).as_posix()}\n{file_digest(item)}\n".encode())
    return digest.hexdigest()


def model_digest(path: str | Path) -> str:
    """The digest of a model for the stages that run one (Align's aligner, Clean's scorer): an export
    directory's ``manifest.json`` (of its newest numbered version, as the client loads), which holds every
    file's SHA-256 (the directory itself also gets transcripts and a lock), or the model file's (a
    DeepSpeech/Coqui ``.tflite``)."""
    path = Path(path)
    if not path.is_dir():
        return file_digest(path)
    from native_client.metadata import ExportError, resolve_export_dir

    try:
        return file_digest(resolve_export_dir(path) / "manifest.json")  # a versioned root: its newest
    except ExportError:
        return "missing"
