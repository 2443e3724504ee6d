"""Running one benchmark measurement in a child process: its JSON result and its peak RSS."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_measured(arguments: list[str], env: dict | None = None) -> tuple[dict, float]:
    """Run ``python <arguments>``; returns the JSON object on its last stdout line and its peak RSS in MiB
    (``ru_maxrss`` from ``wait4``, which covers the processes it started and waited for)."""
    process = subprocess.Popen([sys.executable, *arguments], stdout=subprocess.PIPE, env=env, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(arguments)} failed (exit {code})")
    return json.loads(output.strip().splitlines()[-1]), usage.ru_maxrss / 1024
