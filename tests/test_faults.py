"""Fault injection: kills, damaged outputs and odd inputs, each answered by a named error, a fallback or
an exact recovery (issue 15's table; the row numbers are in each test's docstring)."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.reports import TrainReport, read_report
from tests.conftest import ROOT, build_features

# A training child that SIGKILLs itself at a chosen checkpoint save: after it ("after") or in the middle of
# it ("during": the checkpoint files are written but the manager's state file does not list them yet).
_KILLED_TRAIN = textwrap.dedent("""
    import logging, os, signal, sys
    logging.basicConfig(level=logging.INFO)
    from tensorflow.python.checkpoint import checkpoint_management
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.train_stage import train_stage
    from pipeline.trainer import Trainer

    mode, at = os.environ.get("KILL_MODE"), int(os.environ.get("KILL_AT_SAVE", "0"))
    saves = {"n": 0}
    if mode == "after":
        original_save = Trainer._save
        def _save(self, history=None):
            original_save(self, history)
            saves["n"] += 1
            if saves["n"] == at:
                os.kill(os.getpid(), signal.SIGKILL)
        Trainer._save = _save
    elif mode == "during":
        original_record = checkpoint_management.CheckpointManager._record_state
        def _record_state(self):
            if "checkpoints" in self.directory:
                saves["n"] += 1
                if saves["n"] == 2 * at - 1:  # the manager records each save twice; the first of the at-th
                    os.kill(os.getpid(), signal.SIGKILL)
            original_record(self)
        checkpoint_management.CheckpointManager._record_state = _record_state
    report = train_stage(Layout(load_config(sys.argv[1])))
    print("RESULT", report.global_step, report.weights_sha256, flush=True)
""")

_DROPOUT = """
model:
  dropout_rate: 0.2
  dropout_rate4: 0.1
training:
  epochs: 2
  batch_size: 2
  checkpoint_secs: 1
"""


def _train_child(script, config_path, env=None, timeout=400):
    return subprocess.run([sys.executable, str(script), str(config_path)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Digest of a run with dropout that was never interrupted (the reference for exact resume)."""
    from tests.conftest import small_config_text
    root = tmp_path_factory.mktemp("clean")
    base = root / "base.yaml"
    base.write_text(small_config_text(root / "work", limit_train=40))
    path = root / "clean.yaml"
    path.write_text("extends: base.yaml\n" + _DROPOUT)
    build_features(load_config(path))
    script = root / "train.py"
    script.write_text(_KILLED_TRAIN)
    result = _train_child(script, path)
    assert result.returncode == 0, result.stderr[-3000:]
    step, digest = result.stdout.split("RESULT")[1].split()
    return int(step), digest, script


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["after", "during"])
def test_sigkill_at_a_checkpoint_resumes_to_the_same_weights(mode, uninterrupted, small_config):
    """Row 3: SIGKILL after a checkpoint, or inside a checkpoint write, then a rerun; with dropout on, the
    final weights' SHA-256 equals the uninterrupted run's (dropout RNG state is checkpointed)."""
    clean_step, clean_digest, script = uninterrupted
    path = small_config(f"{mode}.yaml", limit_train=40, extra=_DROPOUT)
    config = load_config(path)
    build_features(config)
    killed = _train_child(script, path, {"KILL_MODE": mode, "KILL_AT_SAVE": "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    run = Layout(config).train_run
    assert not run.report.exists()
    resumed = _train_child(script, path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    restored = [line for line in resumed.stderr.splitlines() if "Restored" in line]
    assert restored and " step 0 " not in restored[0], restored
    step, digest = resumed.stdout.split("RESULT")[1].split()
    assert int(step) == clean_step
    assert digest == clean_digest
