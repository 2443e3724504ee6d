"""Running one benchmark measurement in a child process: its JSON result and its peak RSS."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

# Starts argv[2:] and writes its exit code and peak RSS (KiB) to argv[1]. The kernel's peak of a process
# starts at the size of the process it was forked from, so a child of the benchmark itself would report
# the benchmark's own size as a floor; the launcher is small, and so is its child.
_LAUNCHER = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "open(sys.argv[1], 'w').write(f'{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}')\n"
)


def run_measured(arguments: list[str], env: dict | None = None) -> tuple[dict, float]:
    """Run ``python <arguments>``; returns the JSON object on its last stdout line and its peak RSS in MiB
    (``ru_maxrss`` from ``wait4``, which covers the processes it started and waited for)."""
    with tempfile.TemporaryDirectory() as folder:
        peak = Path(folder) / "peak"
        process = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, str(peak), sys.executable, *arguments],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        code, kib = (int(value) for value in peak.read_text().split())
    if code != 0:
        raise SystemExit(f"{' '.join(arguments)} failed (exit {code})")
    return json.loads(process.stdout.strip().splitlines()[-1]), kib / 1024
