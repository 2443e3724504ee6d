"""``deepspeech-train gc`` (issue 36, 7): after a changed setting, what no given config's DAG reaches is
listed exactly, removed with its size told, and never a running stage's output nor a numbered export."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from tests.conftest import ROOT, build_features


def _gc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tasks.cli", "gc", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _listed(output: str, verb: str) -> set[str]:
    return {line[len(verb) + 1 :].rsplit(" (", 1)[0] for line in output.splitlines() if line.startswith(verb)}


def test_gc_lists_exactly_the_outputs_a_changed_setting_left_behind(small_config, tmp_path):
    old = small_config("old.yaml", limit_dev=8)
    new = small_config("new.yaml", limit_dev=4)
    old_layout, new_layout = Layout(load_config(old)), Layout(load_config(new))
    build_features(load_config(old))
    build_features(load_config(new))
    assert old_layout.features_cache("dev") != new_layout.features_cache("dev")
    assert old_layout.features_cache("train") == new_layout.features_cache("train")
    features = old_layout.work_dir / "features"
    stale = old_layout.features_cache("dev").stem  # dev-<old fingerprint>
    expected = {str(p) for p in features.iterdir() if p.name.startswith(stale) and not p.name.startswith(".")}
    assert str(old_layout.features_cache("dev")) in expected
    export = old_layout.export_root / "1"
    export.mkdir(parents=True)
    (export / "output_graph.pb").write_bytes(b"x" * 100)

    dry = _gc("--config", str(new), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert _listed(dry.stdout, "would remove") == expected
    size = sum(p.stat().st_size for p in features.iterdir() if str(p) in expected)
    assert dry.stdout.splitlines()[-1].endswith(f"({size} bytes)"), dry.stdout
    assert "export" not in dry.stdout
    assert all(Path(p).exists() for p in expected)

    both = _gc("--config", str(new), "--config", str(old), "--dry-run")
    assert both.returncode == 0 and "would remove" not in both.stdout, both.stdout

    # A stage writing the old cache (its lock held) keeps it; the rest goes.
    with stage_lock(old_layout.features_cache("dev")):
        busy = _gc("--config", str(new))
    assert f"kept {old_layout.features_cache('dev')}: in use" in busy.stdout, busy.stdout
    assert old_layout.features_cache("dev").exists()
    done = _gc("--config", str(new))
    assert done.returncode == 0 and _listed(done.stdout, "removing") == expected, done.stdout
    assert not any(p.name.startswith(stale) for p in features.iterdir())
    for split in ("train", "dev", "test"):
        assert new_layout.features_cache(split).is_file()
    assert (export / "output_graph.pb").is_file()


def test_gc_refuses_a_config_it_cannot_resolve(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"paths:\n  work_dir: {tmp_path}\ndata:\n  corpora:\n    - importer: folder\n      path: /nowhere\n"
    )
    result = _gc("--config", str(bad), "--dry-run")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "gc removed nothing" in result.stderr, result.stderr
