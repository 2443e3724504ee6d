"""The model cache of ``make fetch-models``: a missing model fails its tests with one line, never skips."""

from __future__ import annotations

import os
import subprocess
import sys

from data.fetch_models import MODELS, model_path
from tests.conftest import ROOT


def test_a_missing_model_fails_its_tests_with_the_make_target_named(tmp_path):
    env = {**os.environ, "LUIGI_DEEPSPEECH_MODELS": str(tmp_path)}
    test = "tests/test_deepspeech_frontend.py::test_equals_the_coqui_models_own_mfcc_subgraph"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stdout
    assert "1 error" in result.stdout and "skipped" not in result.stdout
    assert (
        f"{tmp_path / MODELS['armspeech'].file_name}: the armspeech model is missing; run `make fetch-models`"
        in result.stdout
    )
    check = subprocess.run(
        [sys.executable, "data/fetch_models.py", "--check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert check.returncode == 1 and "make fetch-models" in check.stderr and check.stderr.count("\n") == 1


def test_the_cache_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("LUIGI_DEEPSPEECH_MODELS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert (
        model_path("armspeech")
        == tmp_path / "luigi-deepspeech" / "models" / "armspeech-0.1.4" / "model.tflite"
    )
    monkeypatch.setenv("LUIGI_DEEPSPEECH_MODELS", str(tmp_path / "elsewhere"))
    assert model_path("armspeech") == tmp_path / "elsewhere" / "armspeech-0.1.4" / "model.tflite"
