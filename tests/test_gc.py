"""``deepspeech-train gc`` (issue 36, 7): after a changed setting, what no given config's DAG reaches is
listed exactly, removed with its size told, and never a running stage's output nor a numbered export."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from native_client.alphabet import load_alphabet
from pipeline.config_loader import load_config
from pipeline.features.cache import read_cache
from pipeline.files import host_name, remove_leftovers
from pipeline.layout import Layout
from pipeline.locks import held, lock_path, stage_lock, try_locks
from pipeline.model.averaging import stage_model
from pipeline.stages.gc import _owner, remove_group, unreachable
from pipeline.stages.train import train_stage
from pipeline.workdir import LEFTOVER_PATTERNS
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


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_gc_removes_under_the_lock_and_a_stage_never_locks_a_removed_lock_file(small_config):
    """The listing's lock check is not trusted for the removal: a stage that takes the lock after the
    listing keeps its files; and a stage that opened a lock file gc then removed (held) locks the file
    the path names afterwards, so a second stage sees it held (never two writers)."""
    old, new = small_config("old.yaml", limit_dev=8), small_config("new.yaml", limit_dev=4)
    build_features(load_config(old), splits=("dev",))
    cache = Layout(load_config(old)).features_cache("dev")
    stale = [e for e in unreachable([load_config(new)]) if _owner(e.path) == _owner(cache)]
    assert cache in {e.path for e in stale} and all(e.lock is None for e in stale)
    with stage_lock(cache):  # a stage started after the listing
        assert not remove_group(stale)
    assert all(e.path.exists() for e in stale)

    # A stage that opened the lock file and waits for it while gc holds it and removes it.
    lock = lock_path(cache)
    stage = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import logging, sys; from pipeline.locks import stage_lock\n"
            "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
            f"with stage_lock({str(cache)!r}):\n"
            "    print('locked', flush=True); sys.stdin.read()\n",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with try_locks([lock]) as taken:
            assert taken
            for line in stage.stderr:  # read as it comes: the stage is waiting on the lock gc holds
                if "waiting for it" in line:
                    break
            lock.unlink()
        assert stage.stdout.readline() == "locked\n"
        assert held(lock), "the stage locked a removed lock file: a second stage would write at once"
    finally:
        stage.communicate("", timeout=60)


def test_gc_keeps_train_runs_unless_asked_and_sweeps_what_a_killed_remover_left(small_config):
    config = small_config("small.yaml")
    layout = Layout(load_config(config))
    other_run = layout.work_dir / "train" / "0123456789abcdef"
    (other_run / "checkpoints").mkdir(parents=True)
    (other_run / "checkpoints" / "ckpt-1.index").write_bytes(b"x" * 10)
    features = layout.work_dir / "features"
    features.mkdir(parents=True)
    dead = features / f".dev-0123.h5.removed-{host_name()}-{_dead_pid()}"
    live = features / f".dev-4567.h5.removed-{host_name()}-{os.getpid()}"
    (dead / "part").mkdir(parents=True)
    live.mkdir()

    dry = _gc("--config", str(config), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"kept {other_run}: a Train run" in dry.stdout and "--include-train removes it" in dry.stdout
    assert _listed(dry.stdout, "would remove") == {str(dead)}, dry.stdout
    listed = _gc("--config", str(config), "--dry-run", "--include-train")
    assert _listed(listed.stdout, "would remove") == {str(dead), str(other_run)}, listed.stdout

    done = _gc("--config", str(config))
    assert done.returncode == 0 and _listed(done.stdout, "removing") == {str(dead)}, done.stdout
    assert other_run.is_dir() and live.is_dir() and not dead.exists()

    # the owning stage's sweep removes a dead remover's entry too, never a live one's
    (dead / "part").mkdir(parents=True)
    assert remove_leftovers(features, LEFTOVER_PATTERNS) == [dead]
    assert live.is_dir()


def test_gc_trims_epoch_ends_no_given_average_wants_with_include_train_only(small_config):
    """A finished run kept epochs 1-3 for {last: 3}: a config asking {last: 2} of the same run leaves epoch
    1 unwanted, one without export.average all three; gc lists them as kept, and with --include-train
    lists or removes exactly those (the union of the given configs' wants stays), never while the run's
    lock is held, nor in a run without its report (still training or killed: Train prunes its own)."""
    extra = "training:\n  epochs: 3\n  max_to_keep: 1\n  validation_epochs: 0\n"
    three = small_config("three.yaml", limit_train=8, extra=extra + "export:\n  average: {last: 3}\n")
    two = small_config("two.yaml", limit_train=8, extra=extra + "export:\n  average: {last: 2}\n")
    plain = small_config("plain.yaml", limit_train=8, extra=extra)
    config = load_config(three)
    build_features(config, ("train", "dev"))
    train_stage(Layout(config))
    run = Layout(config).train_run
    assert Layout(load_config(two)).train_run.root == Layout(load_config(plain)).train_run.root == run.root

    def files(*epochs):
        return {str(p) for p in run.epoch_ends.iterdir() if int(p.name.split(".")[0][6:]) in epochs}

    assert len(files(1, 2, 3)) == 6  # an index and a data file each

    def trimmed(*args):
        result = _gc("--dry-run", *args)
        assert result.returncode == 0, result.stderr
        listed = _listed(result.stdout, "would remove")
        assert listed <= files(1, 2, 3), result.stdout  # nothing else is unreachable here
        return listed, result.stdout

    listed, out = trimmed("--config", str(three), "--include-train")
    assert listed == set() and "epoch-end" not in out, out
    listed, out = trimmed("--config", str(two))  # without --include-train: listed as kept
    kept = {line[len("kept ") :].split(": ")[0] for line in out.splitlines() if ": epoch-end weights" in line}
    assert listed == set() and kept == files(1) and "--include-train removes them" in out, out
    assert trimmed("--config", str(two), "--include-train")[0] == files(1)
    assert trimmed("--config", str(plain), "--include-train")[0] == files(1, 2, 3)
    assert trimmed("--config", str(plain), "--config", str(two), "--include-train")[0] == files(1)

    with stage_lock(run.root):  # a Train of the run (training.epochs raised) has started
        busy = _gc("--config", str(plain), "--include-train")
    assert f"kept {run.epoch_ends}: its Train run is in use" in busy.stdout, busy.stdout
    assert len(files(1, 2, 3)) == 6
    report = run.report.read_bytes()
    run.report.unlink()  # a run that has not ended
    assert trimmed("--config", str(plain), "--include-train")[0] == set()
    run.report.write_bytes(report)

    first = files(1)
    done = _gc("--config", str(two), "--include-train")
    assert done.returncode == 0 and _listed(done.stdout, "removing") == first, done.stdout
    assert not files(1) and len(files(2, 3)) == 4
    _, _, averaging = stage_model(
        load_config(two),
        run,
        None,
        read_cache(Layout(config).features_cache("train"), config.features).n_input,
        load_alphabet(Layout(config).alphabet).n_classes,
    )
    assert averaging.prefixes == (str(run.epoch_end(2)), str(run.epoch_end(3)))


def test_gc_keeps_the_epoch_ends_a_continued_run_wrote_after_its_report(small_config):
    """A run finished 2 epochs with {last: 2}; training.epochs raised to 4, it is stopped in epoch 4, after
    keeping epochs 2 and 3 (its report still says 2 epochs). gc --include-train by that report would want
    epochs 1 and 2; it leaves epoch 3 alone, and the resumed run averages epochs 3 and 4, none missing."""
    from pipeline.train.hooks import StepInfo, StopTraining, TrainHooks

    extra = (
        "training:\n  epochs: {}\n  max_to_keep: 1\n  validation_epochs: 0\nexport:\n  average: {{last: 2}}\n"
    )
    two = small_config("two.yaml", limit_train=8, extra=extra.format(2))
    four = small_config("four.yaml", limit_train=8, extra=extra.format(4))
    config = load_config(two)
    build_features(config, ("train", "dev"))
    train_stage(Layout(config))
    run = Layout(config).train_run
    assert Layout(load_config(four)).train_run.root == run.root

    def stop_in_epoch_4(info: StepInfo) -> None:
        if info.epoch == 3:
            raise StopTraining("asked")

    with pytest.raises(StopTraining):
        train_stage(Layout(load_config(four)), hooks=TrainHooks(on_step=stop_in_epoch_4))
    assert sorted(p.name for p in run.epoch_ends.glob("*.index")) == ["epoch-2.index", "epoch-3.index"]

    done = _gc("--config", str(four), "--include-train")
    assert done.returncode == 0, done.stderr
    assert "epoch-3" not in done.stdout and "epoch-2" not in done.stdout, done.stdout
    resumed = train_stage(Layout(load_config(four)))
    assert resumed.epochs_completed == 4
    _, _, averaging = stage_model(
        load_config(four),
        run,
        None,
        read_cache(Layout(config).features_cache("train"), config.features).n_input,
        load_alphabet(Layout(config).alphabet).n_classes,
    )
    assert (averaging.epochs, averaging.missing) == ((3, 4), ())


def test_gc_removes_an_abandoned_alignments_resume_state_under_its_folders_lock(small_config):
    """Align keeps a killed run's recordings in ``.<folder>.aligned`` beside its folder: gc removes that of a
    folder no config reaches, and keeps it while a process holds the folder's lock; a writer's temporary
    files stay the stage's own."""
    config = load_config(small_config("plain.yaml"))
    work = Layout(config).work_dir
    folder = work / "align" / "books-0123456789ab"
    aligned = folder.with_name(f".{folder.name}.aligned")
    aligned.mkdir(parents=True)
    (aligned / "recording.json").write_text("{}", encoding="utf-8")
    staging = folder.with_name(f".{folder.name}.staging-{host_name()}-{os.getpid()}")
    staging.mkdir()
    found = {e.path: e for e in unreachable([config])}
    assert aligned in found and staging not in found
    assert _owner(aligned) == _owner(folder)
    with stage_lock(folder):  # Align of that folder runs again
        assert not remove_group([found[aligned]])
    assert aligned.exists()
    assert remove_group([found[aligned]])
    assert not aligned.exists() and staging.exists()
