"""Shared fixtures: paths of the project and the sample corpus, small configs in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample"
ALPHABET = ROOT / "data" / "alphabet.txt"


@pytest.fixture
def write_config(tmp_path):
    """Write a YAML config (dedented text) into tmp_path and return its path."""

    def write(text: str, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def small_config_text(
    work_dir: Path, limit_train: int = 16, limit_dev: int = 8, limit_test: int = 8, n_hidden: int = 32
) -> str:
    """YAML of a tiny config on the sample corpus."""
    return textwrap.dedent(f"""
        extends: {ROOT / "configs" / "sample.yaml"}
        paths:
          work_dir: {work_dir}
        data:
          limit_train: {limit_train}
          limit_dev: {limit_dev}
          limit_test: {limit_test}
        features:
          workers: 1
        model:
          deepspeech:
            n_hidden: {n_hidden}
            dropout_rate: 0.0
        training:
          epochs: 2
          batch_size: 4
          dev_batch_size: 8
          checkpoint_secs: 600
          report_count: 2
        early_stop:
          rule: "off"
        augment:
          speed_factors: []
    """)


@pytest.fixture
def small_config(tmp_path):
    """Write a tiny config (see small_config_text) and return its path; features are built on demand."""

    def make(name: str = "small.yaml", extra: str = "", **kwargs) -> Path:
        """``extra``: YAML overriding any keys of the tiny config (written as a file that extends it)."""
        base = tmp_path / f"{Path(name).stem}.base.yaml"
        base.write_text(small_config_text(tmp_path / "work", **kwargs))
        path = tmp_path / name
        path.write_text(f"extends: {base.name}\n" + textwrap.dedent(extra))
        return path

    return make


def build_features(config, splits=("train", "dev", "test")) -> None:
    """Build the feature caches a test needs (skipping those that exist)."""
    from pipeline.layout import Layout
    from pipeline.stages.features import features_stage

    for split in splits:
        if not Layout(config).features_cache(split).exists():
            features_stage(Layout(config), split)


@pytest.fixture(scope="session")
def armspeech_model() -> Path:
    """The armspeech 0.1.4 Coqui STT model (``make fetch-models``). Missing, the test fails with one line
    saying how to get it: never a skip, so CI cannot pass without running these tests."""
    from data.fetch_models import missing_message, model_path

    path = model_path("armspeech")
    if not path.is_file():
        pytest.fail(missing_message("armspeech"), pytrace=False)
    return path


# The files that take longest, first: `make test` hands whole files to two processes in collection order,
# so the long ones start early and both processes finish at about the same time.
LONGEST_FILES = ("test_faults.py", "test_trainer.py", "test_multiworker.py", "test_end_to_end.py")


def pytest_collection_modifyitems(items):
    """Tests using a fetched model get the ``needs_models`` mark (``-m 'not needs_models'`` deselects);
    the files of ``LONGEST_FILES`` are collected first (in that order), the others as they come."""
    for item in items:
        if "armspeech_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.needs_models)

    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: the order within a file is kept


@pytest.fixture(autouse=True)
def no_global_seed_after():
    """A test that sets TensorFlow's global seed (``keras.utils.set_random_seed``) must not hand it to the
    tests after it in the process: under op determinism an unseeded random op raises only while no global
    seed is set (test_determinism.py), so which tests shared a worker decided whether that one passed.
    TensorFlow is not imported for a test that did not."""
    yield
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].random.set_seed(None)


@pytest.fixture(scope="session", autouse=True)
def luigi_leaves_logging_to_pytest():
    """Tasks built in this process must not install luigi.cfg's logging handlers: they would hold the
    stream pytest captures for one test and write to it after it is closed."""
    import luigi

    luigi.configuration.get_config().set("core", "no_configure_logging", "true")
    yield


@pytest.fixture
def tasks_in_process():
    """luigi.cfg runs each task in a forked process; this pytest process has TensorFlow running, which
    does not survive a fork, so tests run tasks in-process."""
    import luigi

    config = luigi.configuration.get_config()
    config.set("worker", "force_multiprocessing", "false")
    yield
    config.set("worker", "force_multiprocessing", "true")


# Starts argv[2:] and writes its exit code and peak RSS (KiB) to argv[1]. A launcher is needed because
# the kernel's peak of a process (ru_maxrss, VmHWM) starts at the size of the process it was forked
# from: a child of this pytest process (TensorFlow loaded, gigabytes) would report that as its own,
# and a test comparing two such peaks could not fail. The launcher is small, and so is its child.
_PEAK_LAUNCHER = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "open(sys.argv[1], 'w').write(f'{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}')\n"
)


def run_with_peak_rss(argv: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``argv`` (``subprocess.run``'s keyword arguments: capture_output, text, cwd, ...); returns its
    result and its own peak RSS in MiB, free of this process's size."""
    with tempfile.TemporaryDirectory() as folder:
        peak = Path(folder) / "peak"
        result = subprocess.run([sys.executable, "-c", _PEAK_LAUNCHER, str(peak), *argv], **kwargs)
        code, kib = (int(value) for value in peak.read_text().split())
    return subprocess.CompletedProcess(argv, code, result.stdout, result.stderr), kib / 1024


@pytest.fixture(scope="session")
def sample_aligner(tmp_path_factory) -> Path:
    """The export of configs/sample.yaml (fewer epochs: an aligner needs less than a recogniser), trained
    through the DAG in a subprocess."""
    folder = tmp_path_factory.mktemp("aligner")
    config = yaml.safe_load((ROOT / "configs/sample.yaml").read_text(encoding="utf-8"))
    config["paths"] = {
        "alphabet": str(ROOT / "data/alphabet.txt"),
        "work_dir": str(folder / "work"),
        "export_dir": str(folder / "export"),
    }
    for key in ("train_files", "dev_files", "test_files"):
        config["data"][key] = [str(ROOT / "data/sample" / Path(p).name) for p in config["data"][key]]
    config["decoder"]["lm_corpus_files"] = [str(ROOT / "data/sample/lm_corpus.txt")]
    config["decoder"]["tune"] = False
    config["training"]["epochs"] = 8
    path = folder / "aligner.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "luigi",
            "--module",
            "tasks",
            "Export",
            "--config",
            str(path),
            "--local-scheduler",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "export"
