"""The line every benchmark prints with its figures: which CPU they came from.

Machines of one kind differ up to 3.5x, so a figure without its CPU says little. The model name and
the vector extensions that decide TensorFlow's and oneDNN's kernels (AVX2, AVX-512, AMX, from
``/proc/cpuinfo``'s flags) and the cache sizes (``lscpu``, else sysfs) are read here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# /proc/cpuinfo flag -> the name a reader knows
EXTENSIONS = {"avx2": "AVX2", "avx512f": "AVX-512", "amx_tile": "AMX"}


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _caches() -> list[str]:
    """``L1d 64 KiB``-style entries from lscpu (its totals), else from sysfs (per core)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    found = []
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("L1d cache", "L2 cache", "L3 cache"):
            found.append(f"{key.strip().split()[0]} {value.strip().split(' (')[0]}")
    if found:
        return found
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind != "Instruction":
            found.append(f"L{level}{'d' if kind == 'Data' else ''} {size}")
    return found


def cpu_line() -> str:
    """``CPU: <model>, <n> cores, AVX2 yes, AVX-512 no, AMX no; L1d .., L2 .., L3 ..``."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    vector = ", ".join(f"{name} {'yes' if flag in flags else 'no'}" for flag, name in EXTENSIONS.items())
    caches = ", ".join(_caches()) or "caches unknown"
    return f"CPU: {info.get('model name', 'unknown')}, {os.cpu_count()} cores, {vector}; {caches}"


if __name__ == "__main__":
    print(cpu_line())
