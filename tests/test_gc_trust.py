"""``deepspeech-train gc`` never deletes what a config still needs (issue 42, G1, G2, G4, G5, G12): two
spellings of one work directory, the files a config names inside a stage directory, the inputs of a
running stage, a symlinked stage directory, an entry it cannot remove."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config_loader import load_config
from pipeline.layout import Layout
from tests.conftest import ROOT, build_features
from tests.plugins.step_barrier import StepBarrier


def _run(module: str, *args: str, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _gc(*args: str) -> subprocess.CompletedProcess:
    return _run("tasks.cli", "gc", *args)


def _listed(output: str, verb: str) -> set[str]:
    return {line[len(verb) + 1 :].rsplit(" (", 1)[0] for line in output.splitlines() if line.startswith(verb)}


def _fake_output(path: Path) -> Path:
    """A stage output made by hand (gc reads only names and sizes)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "report.json").write_text("{}\n")
    return path


def _configs_spelling(tmp_path: Path, small_config, spellings: dict[str, str]) -> dict[str, Path]:
    """A config per spelling of the one work directory ``tmp_path/real/wd``, each with its own model width
    (so each reaches its own Train run and Evaluate directory)."""
    configs = {}
    for width, (name, work_dir) in zip((16, 24, 32), spellings.items(), strict=True):
        configs[name] = small_config(
            f"{name}.yaml", n_hidden=width, extra=f"paths:\n  work_dir: {work_dir}\n"
        )
    return configs


def test_two_spellings_of_one_work_directory_keep_each_others_outputs(small_config, tmp_path):
    real = tmp_path / "real" / "wd"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "y").mkdir()
    spellings = {"linked": f"{tmp_path}/link/wd", "dotted": f"{tmp_path}/real/y/../wd", "plain": str(real)}
    configs = _configs_spelling(tmp_path, small_config, spellings)
    outputs = []
    for path in configs.values():
        layout = Layout(load_config(path))
        outputs += [_fake_output(layout.train_run.root), _fake_output(layout.evaluate_dir)]
    assert len({os.path.realpath(p) for p in outputs}) == 6
    stale = _fake_output(real / "evaluate" / "0123456789ab")

    args = [arg for path in configs.values() for arg in ("--config", str(path))]
    dry = _gc(*args, "--dry-run", "--include-train")
    assert dry.returncode == 0, dry.stderr
    listed = _listed(dry.stdout, "would remove")
    assert listed == {str(stale)}, dry.stdout  # once, by its one canonical path
    assert dry.stdout.count("0123456789ab") == 1, dry.stdout

    done = _gc(*args, "--include-train")
    assert done.returncode == 0, done.stderr
    assert all(path.is_dir() for path in outputs) and not stale.exists(), done.stdout


def test_gc_keeps_the_files_a_config_names_inside_stage_directories(small_config, tmp_path):
    """``paths.alphabet`` under ``<work_dir>/alphabet/`` and a ``training.init_from`` naming another run
    under ``<work_dir>/train/`` (the documented warm start) stay, and the config's own Train fingerprint
    with them: a second gc --include-train does not remove its own run."""
    work = tmp_path / "work"
    alphabet = work / "alphabet" / "fedcba987654" / "alphabet.txt"
    alphabet.parent.mkdir(parents=True)
    shutil.copy(ROOT / "data" / "alphabet.txt", alphabet)
    donor = work / "train" / "0123456789ab"
    (donor / "checkpoints").mkdir(parents=True)
    (donor / "checkpoints" / "ckpt-3.index").write_bytes(b"index")
    (donor / "checkpoints" / "ckpt-3.data-00000-of-00001").write_bytes(b"weights")
    (donor / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-3"\n')
    config = small_config(
        "warm.yaml", extra=f"paths:\n  alphabet: {alphabet}\ntraining:\n  init_from: {donor}\n"
    )
    own = _fake_output(Layout(load_config(config)).train_run.root)
    other = _fake_output(work / "train" / "ba9876543210")

    dry = _gc("--config", str(config), "--dry-run", "--include-train")
    assert dry.returncode == 0, dry.stderr
    assert _listed(dry.stdout, "would remove") == {str(other)}, dry.stdout

    for _ in range(2):
        done = _gc("--config", str(config), "--include-train")
        assert done.returncode == 0, done.stderr
    assert alphabet.is_file() and (donor / "checkpoints" / "ckpt-3.index").is_file() and own.is_dir()
    assert Layout(load_config(config)).train_run.root == own and not other.exists()


def test_gc_never_follows_a_symlinked_stage_directory(small_config, tmp_path):
    config = small_config("small.yaml")
    work = Layout(load_config(config)).work_dir
    shared = tmp_path / "shared" / "lm"
    entry = _fake_output(shared / "0123456789ab")
    work.mkdir(parents=True, exist_ok=True)
    (work / "lm").symlink_to(shared)

    done = _gc("--config", str(config), "--include-train")
    assert done.returncode == 0, done.stderr
    assert f"kept {work / 'lm'}: a symlink to {shared}" in done.stdout, done.stdout
    assert entry.is_dir() and (work / "lm").is_symlink()


def _immutable(path: Path, on: bool) -> None:
    """Make ``path`` impossible to rename or remove, even for root (``chattr +i``); skip where the file
    system cannot."""
    if os.geteuid() != 0:
        path.parent.chmod(0o500 if on else 0o700)
        return
    chattr = shutil.which("chattr")
    result = subprocess.run([chattr or "chattr", "+i" if on else "-i", str(path)], capture_output=True)
    if result.returncode != 0 and on:
        pytest.skip(f"chattr +i is not available here: {result.stderr.decode().strip()}")


def test_an_entry_gc_cannot_remove_is_one_line_and_the_rest_goes(small_config):
    config = small_config("small.yaml")
    work = Layout(load_config(config)).work_dir
    stuck = _fake_output(work / "evaluate" / "0123456789ab")
    loose = _fake_output(work / "tune" / "0123456789ab")
    _immutable(stuck, True)
    try:
        done = _gc("--config", str(config))
    finally:
        _immutable(stuck, False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert f"error: gc could not remove {stuck}" in done.stderr, done.stderr
    assert stuck.is_dir() and not loose.exists()


def test_a_running_stage_keeps_its_inputs_from_gc_and_rerun(small_config, tmp_path):
    """A Train of one config, paused at a step, holds its feature caches shared: gc of another config
    that no longer reaches its dev cache keeps it (naming the lock), make rerun of a stage it reads
    of a stage it reads (for a config sharing the caches) refuses, and the Train then ends well."""
    barrier = StepBarrier(tmp_path / "barrier", 1)
    running = small_config(
        "running.yaml", limit_dev=8, extra="training:\n  epochs: 1\n" + barrier.config_yaml()
    )
    other = small_config("other.yaml", limit_dev=4)
    sibling = small_config("sibling.yaml", limit_dev=8, extra="training:\n  epochs: 2\n")  # same caches
    build_features(load_config(running), ("train", "dev"))
    cache = Layout(load_config(running)).features_cache("dev")
    assert cache != Layout(load_config(other)).features_cache("dev")

    train = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli", "Train", "--config", str(running), "--local-scheduler"],
        cwd=ROOT,
        env=barrier.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        barrier.wait(1, lambda: train.poll() is None or train.stdout.read())
        swept = _gc("--config", str(other))
        assert swept.returncode == 0, swept.stderr
        assert f"kept {cache}: in use by a running stage" in swept.stdout, swept.stdout
        rerun = _run(
            "tasks.rerun", "FeaturesSplit", "--split", "dev", "--config", str(sibling), "--local-scheduler"
        )
        assert rerun.returncode == 2 and f"{cache}.lock" in rerun.stderr, rerun.stdout + rerun.stderr
        assert cache.is_file()
        barrier.release(1)
        output, _ = train.communicate(timeout=600)
    finally:
        if train.poll() is None:
            train.kill()
            train.wait()
    assert train.returncode == 0, output[-3000:]
    assert cache.is_file()
    after = _gc("--config", str(other), "--dry-run")
    assert str(cache) in _listed(after.stdout, "would remove"), after.stdout


def test_a_stage_directory_linked_into_another_work_directory_keeps_its_outputs(small_config, tmp_path):
    """``alice/train -> shared/train``: walking the shared work directory met alice's run by another
    spelling and listed it (review of issue 42, G1/G5)."""
    alice, shared = tmp_path / "alice", tmp_path / "shared"
    (shared / "train").mkdir(parents=True)
    alice.mkdir()
    (alice / "train").symlink_to(shared / "train")
    configs = {
        name: small_config(f"{name}.yaml", n_hidden=width, extra=f"paths:\n  work_dir: {work}\n")
        for name, width, work in (("alice", 16, alice), ("shared", 24, shared))
    }
    runs = [_fake_output(Layout(load_config(path)).train_run.root) for path in configs.values()]
    args = [arg for path in configs.values() for arg in ("--config", str(path))]
    dry = _gc(*args, "--dry-run", "--include-train")
    assert dry.returncode == 0, dry.stderr
    assert "would remove" not in dry.stdout and f"kept {alice / 'train'}: a symlink" in dry.stdout, dry.stdout
    assert all(run.is_dir() for run in runs)


def test_a_symlink_a_config_names_inside_a_stage_directory_is_kept(small_config, tmp_path):
    work = tmp_path / "work"
    (work / "alphabet").mkdir(parents=True)
    target = tmp_path / "mine.txt"
    shutil.copy(ROOT / "data" / "alphabet.txt", target)
    alias = work / "alphabet" / "mine.txt"
    alias.symlink_to(target)
    config = small_config("alias.yaml", extra=f"paths:\n  alphabet: {alias}\n")
    done = _gc("--config", str(config))
    assert done.returncode == 0 and "alphabet" not in done.stdout, done.stdout
    assert alias.is_symlink() and target.is_file()


def test_warm_starting_from_a_run_still_training_is_one_line(small_config, tmp_path):
    """training.init_from naming a run another Train is writing took whatever checkpoint was there; now
    Train stops at once in one line (the run's lock is held)."""
    from pipeline.locks import stage_lock

    work = tmp_path / "work"
    donor = work / "train" / "0123456789ab"
    (donor / "checkpoints").mkdir(parents=True)
    (donor / "checkpoints" / "ckpt-3.index").write_bytes(b"index")
    (donor / "checkpoints" / "ckpt-3.data-00000-of-00001").write_bytes(b"weights")
    (donor / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-3"\n')
    config = small_config("warm.yaml", extra=f"training:\n  init_from: {donor}\n")
    build_features(load_config(config), ("train", "dev"))
    with stage_lock(donor):  # a Train of the donor run, under way
        result = _run("tasks.cli", "Train", "--config", str(config), "--local-scheduler")
    assert result.returncode != 0
    assert "that Train run is still being written" in result.stdout + result.stderr, (
        result.stdout + result.stderr
    )
    assert not Layout(load_config(config)).train_run.report.exists()


def test_a_reader_without_write_access_reads_unlocked(tmp_path, caplog):
    """A shared work directory the user may not write: the read lock cannot be made, the stage still
    reads (with a warning) instead of failing."""
    from pipeline.locks import shared_locks

    folder = tmp_path / "features"
    folder.mkdir()
    _immutable(folder, True)
    try:
        with shared_locks([folder / "dev-0123.h5.lock"]):
            pass
    finally:
        _immutable(folder, False)
    assert "reading its output unlocked" in caplog.text
