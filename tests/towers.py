"""Two training runs compared weight by weight: ``python -m tests.towers one.yaml two.yaml`` trains each
config's Train stage in one process (the devices split as the second config's ``distribution`` says) and
prints ``RUN <towers> <global_step> <updates>`` for each, then ``MAXDIFF <largest difference> <weights>``;
``compare_runs`` runs it and reads those lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compare_runs(one, two, timeout: int = 600) -> tuple[list[tuple[int, int, int]], float, int]:
    """(each run's towers, global step and updates; the largest weight difference; the weights compared)
    of the configs at ``one`` and ``two``, trained in a child process."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.towers", str(one), str(two)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.splitlines()]
    runs = [tuple(int(v) for v in line[1:]) for line in lines if line and line[0] == "RUN"]
    diff, count = next(line[1:] for line in lines if line and line[0] == "MAXDIFF")
    return runs, float(diff), int(count)


def main(argv: list[str]) -> None:
    """Train both configs and print the RUN and MAXDIFF lines."""
    import numpy as np
    import tensorflow as tf

    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.model.checkpoints import resolve_checkpoint
    from pipeline.stages.train import train_stage
    from pipeline.train.distribute import configure_devices

    one, two = load_config(argv[0]), load_config(argv[1])
    configure_devices(two.distribution)
    weights = []
    for config in (one, two):
        report = train_stage(Layout(config))
        print("RUN", report.towers, report.global_step, report.updates, flush=True)
        reader = tf.train.load_checkpoint(resolve_checkpoint(report.latest_checkpoint.rsplit("/", 1)[0]))
        names = [k for k in reader.get_variable_to_shape_map() if k.startswith("weights/")]
        weights.append({k: reader.get_tensor(k) for k in names})
    diff = max(float(np.max(np.abs(weights[0][k] - weights[1][k]))) for k in weights[0])
    print("MAXDIFF", diff, len(weights[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
