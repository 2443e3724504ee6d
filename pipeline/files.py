"""Atomic file writes: write beside the target under a temporary name, then rename."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path: str | Path, data) -> None:
    """Write ``data`` as indented JSON, atomically."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
