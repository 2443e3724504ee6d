"""Fault injection: kills, damaged outputs and odd inputs, each answered by a named error, a fallback or
an exact recovery (issue 15's table; the row numbers are in each test's docstring)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from pipeline.config_loader import load_config
from pipeline.layout import Layout
from tests.conftest import ROOT, build_features, run_with_peak_rss
from tests.plugins.step_barrier import StepBarrier

# A training child that SIGKILLs itself at a chosen checkpoint save: after it ("after") or in the middle of
# it ("during": the checkpoint files are written but the manager's state file does not list them yet).
_KILLED_TRAIN = textwrap.dedent("""
    import logging, os, signal, sys
    logging.basicConfig(level=logging.INFO)
    from tensorflow.python.checkpoint import checkpoint_management
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.stages.train import train_stage
    from pipeline.train.loop import Trainer

    mode, at = os.environ.get("KILL_MODE"), int(os.environ.get("KILL_AT_SAVE", "0"))
    saves = {"n": 0}
    if mode == "after":
        original_save = Trainer._save
        def _save(self, *args, **kwargs):
            original_save(self, *args, **kwargs)
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
  checkpoint_secs: 100000
  checkpoint_steps: 7
augment:
  freq_masks: 2
  time_masks: 2
  feature_noise_std: 0.1
"""


def _train_child(script, config_path, env=None, timeout=400):
    return subprocess.run(
        [sys.executable, str(script), str(config_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


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
    """Row 3: SIGKILL after a checkpoint, or inside a checkpoint write, then a rerun; with dropout and
    feature augmentation on, the final weights' SHA-256 equals the uninterrupted run's (dropout RNG state
    is checkpointed; augmentation is seeded by epoch and step)."""
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


_EARLY_STOP = """
training:
  epochs: 6
early_stop:
  rule: patience
  es_epochs: 1
  es_min_delta: 1000.0
"""


@pytest.mark.long
def test_sigkill_after_an_early_stop_is_saved_resumes_without_training_past_it(small_config, tmp_path):
    """Issue 26 L2: the end of a run was two saves (the epoch's, then one marking the run finished); a kill
    between them resumed an unfinished run with its early stop forgotten and trained on. The patience
    rule here stops after epoch 2; the kill follows the second save."""
    from pipeline.reports import TrainReport, read_report

    path = small_config("stop.yaml", limit_train=8, extra=_EARLY_STOP)
    config = load_config(path)
    build_features(config, ("train", "dev"))
    script = tmp_path / "train.py"
    script.write_text(_KILLED_TRAIN)
    killed = _train_child(script, path, {"KILL_MODE": "after", "KILL_AT_SAVE": "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    run = Layout(config).train_run
    assert not run.report.exists()
    resumed = _train_child(script, path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = read_report(run.report, TrainReport)
    assert (report.stop.rule, report.stop.epoch) == ("patience", 2), report.stop
    assert (report.epochs_completed, report.global_step) == (2, 4)
    assert [v["epoch"] for v in report.validations] == [1, 2]
    clean = small_config(
        "clean-stop.yaml", limit_train=8, extra=_EARLY_STOP + f"paths:\n  work_dir: {tmp_path / 'clean'}\n"
    )
    build_features(load_config(clean), ("train", "dev"))
    uninterrupted = _train_child(script, clean)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    assert resumed.stdout.split("RESULT")[1].split() == uninterrupted.stdout.split("RESULT")[1].split()


# -- a finished small pipeline that the tests below damage (each restores what it broke) ---------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A small config whose Export (Train, LanguageModel on the way) has run; returns (path, config)."""
    import luigi

    from tasks import Export
    from tests.conftest import small_config_text

    root = tmp_path_factory.mktemp("finished")
    base = root / "base.yaml"
    base.write_text(small_config_text(root / "work", limit_train=16))
    path = root / "finished.yaml"
    path.write_text("extends: base.yaml\ndecoder:\n  lm_builder: python\n")
    settings = luigi.configuration.get_config()
    settings.set("worker", "force_multiprocessing", "false")  # see tasks_in_process: no fork under TensorFlow
    try:
        assert luigi.build([Export(config=str(path))], local_scheduler=True, log_level="WARNING")
    finally:
        settings.set("worker", "force_multiprocessing", "true")
    return path, load_config(path)


@pytest.fixture
def restore_files():
    """Back up files a test damages; put them back afterwards (the ``finished`` pipeline is shared)."""
    saved = {}

    def backup(*paths):
        for path in paths:
            saved[path] = (path.read_bytes(), os.stat(path).st_mtime_ns)

    yield backup
    for path, (data, mtime) in saved.items():
        path.write_bytes(data)
        os.utime(path, ns=(mtime, mtime))


def _luigi(*args, timeout=180):
    luigi_bin = Path(sys.executable).parent / "luigi"  # the luigi of the venv running the tests
    return subprocess.run(
        [str(luigi_bin), "--module", "tasks", *args, "--local-scheduler"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_damaged_train_report_fails_at_once_naming_it(finished, restore_files):
    """Row 2: a truncated train_report.json made ``Evaluate`` wait forever; now the run ends, non-zero,
    naming the file and the remedy."""
    path, config = finished
    report = Layout(config).train_run.report
    restore_files(report)
    report.write_text(report.read_text()[:40])
    result = _luigi("Evaluate", "--config", str(path))
    assert result.returncode != 0
    assert f"{report}: damaged Train report" in result.stderr
    assert "make rerun STAGE=Train" in result.stderr


@pytest.mark.slow
def test_damaged_feature_cache_is_refused_naming_it(finished, tmp_path):
    """Row 5: 4 KB overwritten inside the features of a cache (same size) were trained on as NaNs; the
    fletcher32 checksums now refuse the file, by name, in the reader and in training."""
    import shutil

    from native_client.alphabet import load_alphabet
    from pipeline.features.cache import CacheError, read_cache
    from pipeline.train.distribute import make_strategy
    from pipeline.train.loop import Trainer
    from pipeline.train.tasks import TaskData

    _, config = finished
    layout = Layout(config)
    cache = tmp_path / "train.h5"
    shutil.copyfile(layout.features_cache("train"), cache)
    with h5py.File(cache, "r") as h5:
        assert h5["features"].fletcher32
        chunk = h5["features"].id.get_chunk_info(0)
    with open(cache, "r+b") as handle:
        handle.seek(chunk.byte_offset + min(1024, chunk.size // 4))
        handle.write(np.full(1024, np.nan, np.float32).tobytes())
    index = read_cache(cache, config.features)  # the index itself is intact
    with pytest.raises(CacheError, match=f"{cache}: feature cache is damaged .*make rerun STAGE=Features"):
        index.reader().batch(np.arange(len(index)))
    trainer = Trainer(
        config,
        tmp_path / "run",
        [TaskData.only(index, None, load_alphabet(layout.alphabet))],
        make_strategy(config.distribution),
    )
    with pytest.raises(CacheError, match=f"^{cache}: feature cache is damaged"):
        trainer.fit()


def test_non_finite_features_are_rejected_when_written(tmp_path):
    """Row 5: features holding NaN never reach a cache."""
    from native_client.frontends.mfcc import MfccSettings
    from pipeline.config import FeaturesConfig
    from pipeline.features.cache import CacheError, CacheWriter

    features = FeaturesConfig(frontend=MfccSettings(numcep=2, nfilt=2))
    with pytest.raises(CacheError, match="a.wav\\) has non-finite features"):
        with CacheWriter(
            tmp_path / "c.h5", "fp", features, np.array([2]), [[1]], ["a"], ["a.wav"], np.array([0.1])
        ) as writer:
            writer.put(0, np.array([[0.0, np.nan], [1.0, 2.0]], np.float32))
    assert not (tmp_path / "c.h5").exists()


@pytest.mark.slow
def test_edited_or_truncated_export_is_refused_naming_the_file(finished, restore_files, caplog):
    """Rows 6 and 7: an edited metadata.json (flipped normalize, n_steps) or a truncated model.tflite was
    used or failed with a TFLite traceback; the manifest now refuses each, by name, in the client and in
    Export.complete()."""
    from native_client import ExportError, Model
    from tasks import Export

    path, config = finished
    export = Layout(config).find_export()
    assert Export(config=str(path)).complete()
    metadata, tflite = export.metadata, export.file("tflite")
    restore_files(metadata, tflite)
    raw = json.loads(metadata.read_text())
    for key, value in (
        ("features", {**raw["features"], "normalize": not raw["features"]["normalize"]}),
        ("n_steps", 8),
    ):
        metadata.write_text(json.dumps({**raw, key: value}))
        with pytest.raises(ExportError, match=f"^{metadata}: .*(bytes|SHA-256).*make rerun STAGE=Export"):
            Model(export.root)
        assert not Export(config=str(path)).complete()
    metadata.write_text(json.dumps(raw, indent=2) + "\n")
    tflite.write_bytes(tflite.read_bytes()[:1000])
    with pytest.raises(ExportError, match=f"^{tflite}: 1000 bytes, the manifest says"):
        Model(export.root)
    assert not Export(config=str(path)).complete()
    assert any(str(tflite) in r.message for r in caplog.records)


@pytest.mark.slow
def test_damaged_language_model_is_named_before_decoding(finished, restore_files):
    """Row 8: a truncated or garbled LM failed Evaluate after its greedy pass with KenLM's message; now
    LanguageModel is incomplete (it is built again), a stage refuses it before its greedy pass, and the
    client refuses the export's copy, each naming the file."""
    from native_client import ExportError
    from native_client.export_decoder import decoder_for_export
    from native_client.metadata import load_metadata
    from pipeline.lm.files import LanguageModelDamaged
    from pipeline.stages.evaluate import evaluate_stage
    from tasks import LanguageModel

    path, config = finished
    layout = Layout(config)
    build_features(config, ("test",))  # its own, not another test's: the stage reads the test split first
    lm = layout.lm.root / json.loads(layout.lm.report.read_text())["lm"]
    restore_files(lm)
    assert LanguageModel(config=str(path)).complete()
    lm.write_bytes(lm.read_bytes()[:5000])
    assert not LanguageModel(config=str(path)).complete()
    with pytest.raises(LanguageModelDamaged, match=f"^{lm}: 5000 bytes.*make rerun STAGE=LanguageModel"):
        evaluate_stage(layout)
    export = layout.find_export()
    exported_lm = export.root / load_metadata(export.root).decoder["lm"]
    restore_files(exported_lm)
    garbled = bytearray(exported_lm.read_bytes())
    garbled[100:110] = b"##########"
    exported_lm.write_bytes(bytes(garbled))
    with pytest.raises(ExportError, match=f"^{exported_lm}: its SHA-256 differs"):
        decoder_for_export(load_metadata(export.root))


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.mark.slow
def test_export_is_never_missing_while_a_new_one_is_published(finished, tmp_path):
    """Row 9: a kill between Export's two renames left no export; now each file and folder of the new
    export is exchanged with the old one in one step (renameat2), metadata.json last, so a reader polling
    the export never finds a file missing, and the next Export removes the staging directories of killed
    runs (inside the export directory; a leftover beside it from older versions is left to its owner)."""
    import threading

    from pipeline.files import host_name, publish_entries
    from pipeline.stages.export import export_stage

    _, config = finished
    layout = Layout(config)
    export = layout.find_export().root
    target = tmp_path / "export"
    (target / "saved_model").mkdir(parents=True)
    (target / "metadata.json").write_text("0")
    missing, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            if not (target / "metadata.json").exists() or not (target / "saved_model").exists():
                missing.append(1)

    reader = threading.Thread(target=poll)
    reader.start()
    for round_ in range(300):
        new = target / f".staging-{round_}"
        (new / "saved_model").mkdir(parents=True)
        (new / "metadata.json").write_text(str(round_))
        publish_entries(new, target, last=("metadata.json",))
        shutil.rmtree(new)
    stop.set()
    reader.join()
    assert not missing and (target / "metadata.json").read_text() == "299"
    assert sorted(p.name for p in target.iterdir()) == ["metadata.json", "saved_model"]

    dead = _dead_pid()
    leftover = export / f".staging-{host_name()}-{dead}"
    leftover.mkdir()
    (leftover / "model.tflite").write_bytes(b"partial")
    export_stage(layout)
    assert not leftover.exists()


@pytest.mark.slow
def test_export_never_removes_what_it_did_not_write(finished, tmp_path):
    """Issue 26 H2: an unversioned Export swapped the whole of paths.export_dir and removed the old one:
    numbered versions of earlier exports and a user's own files went with it. Now only the entries an
    export wrote (its manifest lists them) are replaced or removed; `make rerun STAGE=Export` removes those
    entries, not the directory."""
    from pipeline.stages.export import export_stage
    from tasks import Export

    path, config = finished
    shared = tmp_path / "models"
    versioned = load_config(_with_export(path, tmp_path, shared, versioned=True))
    for _ in range(2):
        export_stage(Layout(versioned))
    (shared / "README.txt").write_text("my notes")
    plain_path = _with_export(path, tmp_path, shared, versioned=False, name="plain.yaml")
    plain = load_config(plain_path)
    export_stage(Layout(plain))
    first = {p.name for p in shared.iterdir()}
    assert {"1", "2", "README.txt", "metadata.json", "model.tflite", "saved_model"} <= first
    assert (shared / "1" / "metadata.json").is_file() and (shared / "2" / "metadata.json").is_file()
    again = export_stage(Layout(plain))
    assert again.root == shared and {p.name for p in shared.iterdir()} == first
    assert (shared / "README.txt").read_text() == "my notes"
    doomed = Export(config=str(plain_path)).stage_paths()
    assert shared not in doomed and not any(p.name in ("1", "2", "README.txt", ".lock") for p in doomed)
    assert shared / "metadata.json" in doomed and shared / "saved_model" in doomed


def _with_export(
    base: Path,
    tmp_path: Path,
    export_dir: Path,
    versioned: bool,
    n_steps: int | None = None,
    name: str = "versioned.yaml",
) -> Path:
    """A config extending ``base`` that exports to ``export_dir``."""
    config = tmp_path / name
    steps = f"\n  n_steps: {n_steps}" if n_steps else ""
    config.write_text(
        f"extends: {base}\npaths:\n  export_dir: {export_dir}\n"
        f"export:\n  versioned: {str(versioned).lower()}{steps}\n"
    )
    return config


_EXPORT_AT_ONCE = textwrap.dedent("""
    import sys, time
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.stages.export import export_stage
    layout = Layout(load_config(sys.argv[1]))
    import tensorflow  # loaded before the start line, so both exports begin together
    while time.time() < float(sys.argv[2]):
        time.sleep(0.01)
    print("EXPORTED", export_stage(layout).root, flush=True)
""")


@pytest.mark.long
@pytest.mark.slow
def test_two_versioned_exports_at_once_take_two_versions(finished, tmp_path):
    """Issue 26 N2: two versioned Exports at once both took version 1 (the number was chosen as the
    highest plus one, minutes before the export was published); one model was lost and both printed
    the same path. Each export now claims its number by creating its directory."""
    import time

    path, _ = finished
    shared = tmp_path / "models"
    script = tmp_path / "export.py"
    script.write_text(_EXPORT_AT_ONCE)
    configs = [_with_export(path, tmp_path, shared, True, n_steps, f"n{n_steps}.yaml") for n_steps in (8, 12)]
    start = time.time() + 25
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), str(c), str(start)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in configs
    ]
    roots = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        roots.append(Path(out.split("EXPORTED ")[1].strip()))
    assert sorted(r.name for r in roots) == ["1", "2"]
    for root, n_steps in zip(roots, (8, 12), strict=True):
        assert json.loads((root / "metadata.json").read_text())["n_steps"] == n_steps


@pytest.mark.slow
def test_export_into_a_mount_point(finished, tmp_path):
    """Issue 26 N7: Export failed when paths.export_dir was itself a mount point (a Docker volume, a
    PVC): "Device or resource busy" from renaming the directory. Publishing now never renames it. The
    test mounts a tmpfs there (root only; the code itself needs no privilege)."""
    from native_client import open_model
    from pipeline.stages.export import export_stage

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path, _ = finished
    mount = tmp_path / "volume"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)], check=True)
    try:
        for versioned in (False, True, False):
            config = load_config(_with_export(path, tmp_path, mount, versioned, name=f"m{versioned}.yaml"))
            export = export_stage(Layout(config))
            open_model(export.root)
        assert (mount / "1" / "metadata.json").is_file() and (mount / "metadata.json").is_file()
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow
def test_rerun_refuses_to_remove_what_a_live_run_holds(finished):
    """Issue 26 L1: `make rerun` removed a Train folder a live run (maybe on another machine) was using.
    The stage lock a live run holds now makes it refuse, naming the folder and the lock, removing nothing."""
    path, config = finished
    run = Layout(config).train_run.root
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pipeline.locks import stage_lock\n"
            f"with stage_lock({str(run)!r}):\n    print('held', flush=True)\n    time.sleep(120)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for extra in (["--dry-run"], []):
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tasks.rerun",
                    "Train",
                    "--config",
                    str(path),
                    "--local-scheduler",
                    *extra,
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 2, result.stdout + result.stderr
            assert f"error: {run} is in use by a running pipeline (it holds {run}.lock)" in result.stderr
            assert run.is_dir() and (run / "train_report.json").is_file()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_damaged_latest_checkpoint_falls_back_to_the_one_before(finished, tmp_path, caplog):
    """Row 10: with the latest checkpoint's data deleted, Train was stuck on a TensorFlow error; it now
    restores the newest intact checkpoint, with a warning naming the damaged one."""
    import logging
    import shutil

    import tensorflow as tf

    from native_client.alphabet import load_alphabet
    from pipeline.features.cache import read_cache
    from pipeline.train.distribute import make_strategy
    from pipeline.train.loop import Trainer
    from pipeline.train.tasks import TaskData

    _, config = finished
    layout = Layout(config)
    run = tmp_path / "run"
    shutil.copytree(layout.train_run.root, run)
    prefixes = tf.train.get_checkpoint_state(str(run / "checkpoints")).all_model_checkpoint_paths
    assert len(prefixes) >= 2
    latest = run / "checkpoints" / os.path.basename(prefixes[-1])
    for data in run.glob(f"checkpoints/{latest.name}.data-*"):
        data.unlink()
    trainer = Trainer(
        config,
        run,
        [
            TaskData.only(
                read_cache(layout.features_cache("train"), config.features),
                None,
                load_alphabet(layout.alphabet),
            )
        ],
        make_strategy(config.distribution),
    )
    with caplog.at_level(logging.WARNING):
        restored = trainer.restore()
    assert os.path.basename(restored) == os.path.basename(prefixes[-2])
    assert any(f"{latest}: damaged checkpoint" in r.message for r in caplog.records)


def test_impossible_learning_rates_are_refused(write_config):
    """Row 11: ``training.learning_rate: .nan`` (or ``.inf``, or 0) passed the config check."""
    from pipeline.config import ConfigError

    for value in (".nan", ".inf", "-.inf", "0", "-0.001"):
        path = write_config(f"training:\n  learning_rate: {value}\n")
        with pytest.raises(
            ConfigError, match="training.learning_rate: expected a (finite number|value greater than 0)"
        ):
            load_config(path)


@pytest.mark.slow
def test_an_update_that_would_make_weights_non_finite_is_not_applied(finished, tmp_path, caplog):
    """Row 11: a NaN learning rate applied NaN updates, then every checkpoint was NaN. An update that
    would make a weight non-finite is now undone (here the rate overflows float32 to inf)."""
    import dataclasses
    import logging

    from native_client.alphabet import load_alphabet
    from pipeline.features.cache import read_cache
    from pipeline.train.distribute import make_strategy
    from pipeline.train.loop import Trainer, TrainingError
    from pipeline.train.tasks import TaskData

    _, config = finished
    layout = Layout(config)
    overflow = dataclasses.replace(
        config, training=dataclasses.replace(config.training, learning_rate=1e39, max_nonfinite_batches=2)
    )
    trainer = Trainer(
        overflow,
        tmp_path / "run",
        [
            TaskData.only(
                read_cache(layout.features_cache("train"), config.features),
                None,
                load_alphabet(layout.alphabet),
            )
        ],
        make_strategy(config.distribution),
    )
    before = [v.numpy().copy() for v in trainer.model.trainable_variables]
    with caplog.at_level(logging.WARNING), pytest.raises(TrainingError, match="2 batches in a row"):
        trainer.fit()
    assert any("would make weights non-finite, so it was not applied" in r.message for r in caplog.records)
    for old, variable in zip(before, trainer.model.trainable_variables, strict=False):
        assert np.array_equal(old, variable.numpy())


def test_bom_and_duplicate_rows_in_a_manifest(tmp_path):
    """Rows 12 and 13: a CSV with a UTF-8 byte-order mark was refused ("header lacks wav_filename"); the
    same rows listed twice were kept twice. Duplicates are now rejected with reason ``duplicate``."""
    from native_client.alphabet import load_alphabet
    from pipeline.data.manifests import read_manifests
    from pipeline.data.text import TextSettings
    from tests.conftest import ALPHABET, SAMPLE

    rows = (SAMPLE / "train.csv").read_text().splitlines()
    manifest = tmp_path / "bom.csv"
    audio = [line.split(",")[0] for line in rows[1:4]]
    body = [
        f"{SAMPLE / 'train' / os.path.basename(a) if not os.path.isabs(a) else a},"
        + ",".join(line.split(",")[1:])
        for a, line in zip(audio, rows[1:4], strict=False)
    ]
    manifest.write_text("\ufeff" + rows[0] + "\n" + "\n".join(body + body[:2]) + "\n", encoding="utf-8")
    samples, rejects = read_manifests([manifest], 0, load_alphabet(ALPHABET), TextSettings())
    assert len(samples) == 3
    assert [(r.reason, r.source) for r in rejects] == [
        ("duplicate", f"{manifest}:5"),
        ("duplicate", f"{manifest}:6"),
    ]
    assert rejects[0].detail == f"already listed at {manifest}:2"


@pytest.mark.slow
def test_leftovers_of_killed_runs_are_removed_by_the_next_run(finished, tmp_path):
    """Row 14: ``.h5.<pid>.tmp``, ``ckpt-N_temp/``, staging and old export directories and logits scratch
    files of killed runs stayed forever; the next run of their stage removes them (rows 9 covers Export)."""
    from native_client.alphabet import load_alphabet
    from pipeline.features.cache import read_cache
    from pipeline.stages.evaluate import evaluate_stage
    from pipeline.stages.features import features_stage
    from pipeline.train.distribute import make_strategy
    from pipeline.train.loop import Trainer
    from pipeline.train.tasks import TaskData

    _, config = finished
    layout = Layout(config)
    dead = _dead_pid()
    cache = layout.features_cache("dev")
    features_tmp = cache.with_name(f".{cache.name}.{dead}.tmp")
    features_tmp.write_bytes(b"partial")
    features_stage(layout, "dev")
    assert not features_tmp.exists()

    temp_checkpoint = layout.train_run.checkpoints / "ckpt-999_temp"
    temp_checkpoint.mkdir()
    (temp_checkpoint / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"partial")
    report_tmp = layout.train_run.report.with_name(f".{layout.train_run.report.name}.{dead}.tmp")
    report_tmp.write_text("{")
    Trainer(
        config,
        layout.train_run.root,
        [
            TaskData.only(
                read_cache(layout.features_cache("train"), config.features),
                None,
                load_alphabet(layout.alphabet),
            )
        ],
        make_strategy(config.distribution),
    )
    assert not temp_checkpoint.exists() and not report_tmp.exists()
    assert list(layout.train_run.checkpoints.glob("ckpt-*.index"))  # the real checkpoints stay

    out = tmp_path / "evaluate"
    out.mkdir()
    build_features(config, ("test",))
    scratch = Layout.logits_scratch(out).with_name(f".logits-{dead}.h5")
    scratch.write_bytes(b"partial")
    evaluate_stage(layout, out_dir=out, beam=False)
    assert not scratch.exists()


@pytest.mark.slow
def test_a_long_recording_is_transcribed_in_bounded_memory(finished, tmp_path):
    """Row 15: one-shot transcription held the whole file's features and windows (~80 MB per audio
    minute, 3.4 GB for this file with the LM); it now streams the file in blocks and beam-decodes it in
    segments cut at pauses. A 30-minute file may need at most 150 MB more than a 10-second one: only the
    logits (0.7 MB per minute) and the frames normalisation needs (0.6 MB per minute) grow with the
    audio, held in up to three copies while they are joined and normalised (~4 MB per minute); measured
    about 100 MB."""
    import soundfile

    from tests.conftest import SAMPLE

    _, config = finished
    export = Layout(config).find_export().root
    clip, rate = soundfile.read(SAMPLE / "test" / "00003.flac", dtype="int16")
    short, long_ = tmp_path / "short.wav", tmp_path / "long.wav"
    soundfile.write(short, np.tile(clip, int(np.ceil(10 * rate / len(clip))))[: 10 * rate], rate)
    with soundfile.SoundFile(long_, "w", rate, 1, subtype="PCM_16") as sink:
        written = 0
        while written < 30 * 60 * rate:
            sink.write(clip)
            written += len(clip)
    peaks = {}
    for name, audio in (("short", short), ("long", long_)):
        result, peaks[name] = run_with_peak_rss(
            [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(audio), "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert json.loads(result.stdout)["duration_s"] > (1700 if name == "long" else 9), result.stderr[
            -2000:
        ]
    assert peaks["long"] - peaks["short"] < 150, peaks


@pytest.mark.slow
def test_lost_checkpoint_state_file_still_resumes(finished, tmp_path, caplog):
    """Row 10: a missing or damaged ``checkpoint`` state file made TensorFlow list no checkpoint, so a rerun
    would have trained from the start; the checkpoints found on disk are used, with a warning."""
    import logging
    import shutil

    import tensorflow as tf

    from native_client.alphabet import load_alphabet
    from pipeline.features.cache import read_cache
    from pipeline.train.distribute import make_strategy
    from pipeline.train.loop import Trainer
    from pipeline.train.tasks import TaskData

    _, config = finished
    layout = Layout(config)
    run = tmp_path / "run"
    shutil.copytree(layout.train_run.root, run)
    newest = tf.train.latest_checkpoint(str(run / "checkpoints"))
    (run / "checkpoints" / "checkpoint").write_text("garbage {{{")
    trainer = Trainer(
        config,
        run,
        [
            TaskData.only(
                read_cache(layout.features_cache("train"), config.features),
                None,
                load_alphabet(layout.alphabet),
            )
        ],
        make_strategy(config.distribution),
    )
    with caplog.at_level(logging.WARNING):
        assert trainer.restore() == newest
    assert any("lists no checkpoint; resuming from the" in r.message for r in caplog.records)


def test_a_damaged_feature_shard_part_is_recomputed(write_config, tmp_path, caplog):
    """Row 4: a truncated shard part failed every rerun with ``BadZipFile`` and no path; it is now removed
    with a warning naming it and computed again."""
    import logging

    from pipeline.features.shards import process_shard, shard_key
    from pipeline.model.objectives.ctc import ctc_min_frames
    from pipeline.stages.features import features_stage
    from tests.conftest import ALPHABET, SAMPLE

    path = write_config(f"""
        paths:
          work_dir: {tmp_path / "work"}
          alphabet: {ALPHABET}
        data:
          train_files: [{SAMPLE / "train.csv"}]
          limit_train: 40
        features:
          workers: 1
    """)
    config = load_config(path)
    layout = Layout(config)
    parts = layout.features_parts("train")
    parts.mkdir(parents=True)
    from native_client.alphabet import load_alphabet
    from pipeline.data.manifests import read_manifests

    samples, _ = read_manifests(config.split_files("train"), 40, load_alphabet(ALPHABET), config.data.text)
    jobs = [(s.audio_path, ctc_min_frames(s.labels), None, s.offset, s.duration) for s in samples[:32]]
    part = layout.features_part(parts, 0, shard_key(jobs))
    process_shard(str(part), jobs, config.features, 0.0, shard_key(jobs))
    part.write_bytes(part.read_bytes()[:200])
    with caplog.at_level(logging.WARNING):
        summary = features_stage(layout, "train")
    assert summary.kept == 40
    assert any(f"{part}: damaged feature shard" in r.message for r in caplog.records)


def test_a_diverging_loss_warns_once(caplog):
    """Deliverable 6: a loss 100x its first value warns once."""
    import logging

    from pipeline.train.summaries import LossWatch

    watch = LossWatch()
    with caplog.at_level(logging.WARNING):
        for step, loss in enumerate([2.0, 50.0, 201.0, 500.0, 900.0], 1):
            watch(step, loss)
    warnings = [r.message for r in caplog.records if "over 100x the first loss" in r.message]
    assert len(warnings) == 1 and warnings[0].startswith("Step 3: loss 201")


def _deepspeech_train(*args, cwd=ROOT, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "tasks.cli", *args, "--local-scheduler"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_transcribe_answers_for_the_file_as_it_is_now(finished, tmp_path):
    """Issue 26 N4: Transcribe's record was keyed on the audio's path: after the file was overwritten
    with another recording it said complete, printed nothing, and its record kept the old duration; and
    a repeated Transcribe never printed the transcript again. The record is now keyed on the content
    too, and every Transcribe prints (a repeated one from the record, without decoding)."""
    import soundfile

    from tests.conftest import SAMPLE

    path, config = finished
    clip = tmp_path / "x.wav"
    durations = []
    for source in (SAMPLE / "test" / "00003.flac", SAMPLE / "test" / "00005.flac", None):
        if source is not None:
            audio, rate = soundfile.read(source, dtype="int16")
            soundfile.write(clip, audio, rate)
            durations.append(len(audio) / rate)
        result = _deepspeech_train("Transcribe", "--config", str(path), "--audio", str(clip))
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"audio:      {clip}\n" in result.stdout and "hypothesis: " in result.stdout, result.stdout
    assert abs(durations[0] - durations[1]) > 0.3
    export = Layout(config).find_export()
    record = json.loads(export.transcript(clip, Layout(config).export_fingerprint).read_text())
    assert record["duration_s"] == pytest.approx(durations[1], abs=0.02)


@pytest.mark.slow
def test_a_read_only_work_directory_still_answers(finished, tmp_path):
    """Issue 26 N8: with the work directory read-only, deepspeech-train Export (already complete) exited
    1 with a traceback on its log file, and Transcribe decoded, then failed writing its record and never
    printed the transcript. Now the log goes to the temporary directory (with a note), Transcribe prints
    and warns that its record is not kept; both exit 0. The work directory is made read-only by a
    read-only bind mount (tests run as root, whom file modes do not stop; a read-only mount stops
    everyone, with the same "Read-only file system" a user meets)."""
    from tests.conftest import SAMPLE

    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    path, config = finished
    work = Layout(config).work_dir
    subprocess.run(["mount", "--bind", str(work), str(work)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(work)], check=True)
        with pytest.raises(OSError, match="Read-only file system"):
            (work / "probe").write_text("x")
        export = _deepspeech_train("Export", "--config", str(path))
        assert export.returncode == 0, export.stderr[-3000:]
        assert "cannot be written (Read-only file system); logging to " in export.stderr
        clip = tmp_path / "fresh.flac"
        clip.write_bytes((SAMPLE / "test" / "00004.flac").read_bytes())
        transcribe = _deepspeech_train("Transcribe", "--config", str(path), "--audio", str(clip))
        assert transcribe.returncode == 0, transcribe.stderr[-3000:]
        assert "hypothesis: " in transcribe.stdout
        assert "the transcript is not kept (Read-only file system)" in transcribe.stderr
    finally:
        subprocess.run(["umount", str(work)], check=True)


@pytest.mark.slow
def test_a_directory_given_as_audio_is_named(finished, tmp_path):
    """Issue 26 N10: ``--audio <directory>`` said "cannot decode audio ... Format not recognised", in the
    client and in Transcribe; both now say the path is a directory. Audio that cannot be used is a data
    error: Transcribe runs once, not again after Luigi's 30-second retry delay."""
    path, config = finished
    folder = tmp_path / "clips"
    folder.mkdir()
    export = Layout(config).find_export().root
    client = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert client.returncode == 1 and f"error: {folder}: is a directory, not an audio file" in client.stderr
    transcribe = _deepspeech_train("Transcribe", "--config", str(path), "--audio", str(folder))
    assert transcribe.returncode != 0
    assert f"{folder}: is a directory, not an audio file" in transcribe.stderr, transcribe.stderr[-3000:]
    assert "Format not recognised" not in client.stderr + transcribe.stderr
    runs = [
        line
        for log in (Layout(config).work_dir / "logs").glob("*.log")
        for line in log.read_text().splitlines()
        if "running   Transcribe(" in line and str(folder) in line
    ]
    assert len(runs) == 1, runs


def test_audio_that_cannot_be_used_is_final_unless_a_read_failed():
    """What the file says (a folder, no such file, content libsndfile cannot decode) fails the same way
    again: never retried. A read that failed (an OSError such as EIO, libsndfile's system error) may
    pass: retried."""
    import errno

    import soundfile

    from native_client.audio import AudioError
    from tasks.retries import is_final

    def audio_error(cause):
        try:
            raise AudioError("unreadable_audio", "x.wav: cannot decode audio") from cause
        except AudioError as error:
            return error

    assert is_final(audio_error(None)) and is_final(audio_error(FileNotFoundError("x.wav")))
    assert is_final(audio_error(soundfile.LibsndfileError(1, "Format not recognised")))
    assert not is_final(audio_error(soundfile.LibsndfileError(2, "System error")))
    assert not is_final(audio_error(OSError(errno.EIO, "Input/output error")))


def _task_process(work: Path, task: str) -> int:
    """The pid of the process Luigi's worker runs ``task`` in, from the run's log file."""
    import re

    for log in (work / "logs").glob("*.log"):
        found = re.search(rf"\[pid (\d+)\] Worker .* running   {task}\(", log.read_text())
        if found:
            return int(found.group(1))
    raise AssertionError(f"no {task} process in the logs of {work}")


@pytest.mark.long
@pytest.mark.slow
def test_sigterm_stops_training_with_a_checkpoint_of_its_last_step(small_config, tmp_path):
    """Issue 26 N6: Luigi's worker stops its task processes with SIGTERM (when it lost its scheduler, on
    Ctrl-C), as does a container stopping; Train died at once, losing every step since its last checkpoint.
    It now stops at the end of the step with a checkpoint of that step, and a rerun resumes there.
    The signal falls while training is paused after step 20 (4 steps into the second epoch of 16): the
    stop comes at the end of the next step, 21, whatever the CPU's speed."""
    import re

    barrier = StepBarrier(tmp_path / "barrier", 20)
    path = small_config(
        "term.yaml",
        limit_train=64,
        limit_dev=4,
        limit_test=4,
        extra="training:\n  epochs: 6\n" + barrier.config_yaml(),
    )
    checkpoints = Layout(load_config(path)).train_run.checkpoints
    run = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli", "Train", "--config", str(path), "--local-scheduler"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=barrier.env(),
    )
    try:
        (pid, step_in_epoch), *_ = barrier.wait(
            20, lambda: run.poll() is None or run.stderr.read()[-3000:]
        ).items()
        assert pid == _task_process(Layout(load_config(path)).work_dir, "Train") and step_in_epoch == 4
        os.kill(pid, signal.SIGTERM)
        barrier.release(20)
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode != 0
    stopped = re.search(r"training stopped by SIGTERM after step (\d+); a checkpoint of that step was", err)
    assert stopped, err[-3000:]
    assert int(stopped.group(1)) == 21 and (checkpoints / "ckpt-21.index").is_file()  # mid-epoch, saved
    again = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "Train", "--config", str(path), "--local-scheduler"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=barrier.env(),
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ckpt-21" in again.stderr  # restored from it
    assert json.loads(Layout(load_config(path)).train_run.report.read_text())["global_step"] == 6 * 16


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.long
@pytest.mark.slow
def test_sigterm_to_deepspeech_train_stops_its_training_and_leaves_no_process(small_config, tmp_path):
    """Issue 42 G6: SIGTERM to deepspeech-train itself (a container stopping, a job manager, `kill`) killed it
    alone: Luigi's worker runs each task in a process of its own, and Train trained on in it, an orphan
    holding the run's lock. deepspeech-train now passes the signal on to its task processes and waits for
    them: Train, paused after step 20, stops after step 21 with a checkpoint of it, deepspeech-train exits,
    and no process of the run is left, nor its lock held."""
    import fcntl
    import re

    from pipeline.locks import lock_path

    barrier = StepBarrier(tmp_path / "barrier", 20)
    path = small_config(
        "cli_term.yaml",
        limit_train=64,
        limit_dev=4,
        limit_test=4,
        extra="training:\n  epochs: 6\n" + barrier.config_yaml(),
    )
    config = load_config(path)
    build_features(config, ("train", "dev"))
    run = Layout(config).train_run
    errors = tmp_path / "stderr"
    with open(errors, "w") as stderr:
        cli = subprocess.Popen(
            [sys.executable, "-m", "tasks.cli", "Train", "--config", str(path), "--local-scheduler"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=barrier.env(),
        )
    task = None
    try:
        (task, _), *_ = barrier.wait(20, lambda: cli.poll() is None or errors.read_text()[-3000:]).items()
        assert task != cli.pid  # Train runs in a process of its own
        cli.send_signal(signal.SIGTERM)
        passed_on = "SIGUSR2 (a stop passed on by the process that started this one): training stops after"
        deadline = time.monotonic() + 120
        while passed_on not in errors.read_text():  # the task process has the request
            assert time.monotonic() < deadline and cli.poll() is None, errors.read_text()[-3000:]
            time.sleep(0.05)
        barrier.release(20)
        cli.wait(timeout=300)
    finally:
        for pid in (cli.pid, task):
            if pid is not None and _running(pid):
                os.kill(pid, signal.SIGKILL)
        cli.wait()
    text = errors.read_text()
    assert cli.returncode != 0, text[-3000:]
    assert "note: SIGTERM: passed on to the running tasks" in text, text[-3000:]
    stopped = re.search(
        r"training stopped by SIGUSR2 .*? after step (\d+); a checkpoint of that step was", text
    )
    assert stopped and int(stopped.group(1)) == 21, text[-3000:]
    assert (run.checkpoints / "ckpt-21.index").is_file()
    assert not _running(task)  # no orphan
    with open(lock_path(run.root)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the run's lock is free


@pytest.mark.slow
def test_evaluate_streams_every_result_to_a_file(finished, tmp_path):
    """Issue 26 L5: Evaluate held every utterance's result in memory and in evaluation.json (about 6 MiB per
    test hour). They now go to samples.jsonl / samples_lm.jsonl as they come; the report keeps the figures
    and the best and worst samples, which equal what the whole list gives."""
    from pipeline.evaluation.metrics import SampleResult, best_and_worst, corpus_rates
    from pipeline.stages.evaluate import evaluate_stage

    _, config = finished
    build_features(config, ("test",))
    report = evaluate_stage(Layout(config), out_dir=tmp_path / "eval", beam=True)
    saved = json.loads((tmp_path / "eval" / "evaluation.json").read_text())
    assert not any(isinstance(value, list) and len(value) == report.samples_count for value in saved.values())
    fields = [f for f in SampleResult.__dataclass_fields__]
    for name, rates, samples in (
        ("samples_file", ("wer", "cer"), "samples"),
        ("samples_lm_file", ("wer_lm", "cer_lm"), "samples_lm"),
    ):
        lines = [json.loads(line) for line in (tmp_path / "eval" / saved[name]).read_text().splitlines()]
        assert sorted(line["index"] for line in lines) == list(range(report.samples_count))
        lines.sort(key=lambda line: line["index"])
        results = [SampleResult(**{f: line[f] for f in fields}) for line in lines]
        whole = corpus_rates(results)
        assert (saved[rates[0]], saved[rates[1]]) == pytest.approx((whole["wer"], whole["cer"]))
        assert saved[samples] == best_and_worst(results, config.training.report_count)
    assert saved["loss"] == pytest.approx(corpus_rates(results)["loss"])


def test_a_score_board_holds_only_the_samples_it_reports(tmp_path):
    """Issue 26 L5: the figures of 200,000 utterances gathered in about the memory of the few kept."""
    import tracemalloc

    from pipeline.evaluation.metrics import SampleResult, ScoreBoard

    with open(os.devnull, "w") as sink:
        board = ScoreBoard(5, sink)
        tracemalloc.start()
        for index in range(200_000):
            words = 5 + index % 7
            board.add(
                index,
                SampleResult(
                    f"/corpus/clip-{index}.flac",
                    "a reference sentence " * 3,
                    "a hypothesis",
                    float(index % 13),
                    index % 4,
                    words,
                    index % 9,
                    60,
                ),
            )
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert board.rates()["samples_count"] == 200_000
    assert peak < 1 << 20, peak
