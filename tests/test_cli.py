"""The commands a user types: deepspeech-train's checks and exit codes, and the installed wheel."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLE


def _train_command(*args, cwd: Path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tasks.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_config_mistakes_are_one_line_before_anything_runs(tmp_path):
    """A misspelt key, a wrong type, en.yaml's placeholders and a missing manifest: one line, exit 2,
    and nothing written (no work directory, so no lock or partial output)."""
    work = tmp_path / "work"
    cases = {
        "misspelt.yaml": (
            f"paths:\n  work_dir: {work}\ntraning:\n  epochs: 3\n",
            "misspelt.yaml: unknown section 'traning'",
        ),
        "wrong_type.yaml": (
            f"paths:\n  work_dir: {work}\nmodel:\n  n_hidden: big\n",
            "wrong_type.yaml: model.n_hidden: expected an integer, got 'big'",
        ),
        "template.yaml": (
            f"extends: {ROOT / 'configs' / 'en.yaml'}\npaths:\n  work_dir: {work}\n",
            "still hold the template's placeholder paths; copy the file",
        ),
        "missing.yaml": (
            f"paths:\n  work_dir: {work}\ndata:\n  train_files: [{tmp_path / 'nope.csv'}]\n",
            f"data.train_files: {tmp_path / 'nope.csv'} does not exist",
        ),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        result = _train_command("Train", "--config", str(tmp_path / name), "--local-scheduler", cwd=tmp_path)
        assert result.returncode == 2, (name, result.stderr)
        line = _one_line(result.stderr)
        assert line.startswith("error: ") and expected in line, (name, line)
    assert not work.exists()


def test_train_settings_train_would_refuse_are_one_line_before_anything_runs(tmp_path):
    """Issue 42 G7: three mistakes Train found only once it ran (after the imports and features, then retried
    six times): distribution.local_workers without strategy multi_worker, a training.hooks module that does
    not exist, a training.global_batch_size that does not split over the towers. Each is one line naming
    the key, exit 2, and nothing written (no work directory: nothing was imported), from deepspeech-train
    and from `luigi --module tasks` alike. Run in the checkout, where tests.plugins.step_barrier exists."""
    import os

    work = tmp_path / "work"
    base = f"extends: {ROOT / 'configs' / 'sample.yaml'}\npaths:\n  work_dir: {work}\n"
    cases = {
        "workers.yaml": (
            "distribution:\n  local_workers: 2\n",
            "workers.yaml: distribution.local_workers: 2 worker processes need distribution.strategy: "
            "multi_worker (it is auto)",
        ),
        "hooks.yaml": (
            "training:\n  hooks: [tests.plugins.step_barier]\n",
            "hooks.yaml: training.hooks: no module 'tests.plugins.step_barier'",
        ),
        "batch.yaml": (
            "distribution:\n  cpu_devices: 2\ntraining:\n  global_batch_size: 5\n",
            "batch.yaml: training.global_batch_size: 5 does not split over the 2 towers Train will have "
            "(auto over distribution.cpu_devices 2)",
        ),
    }
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the towers of the CPU split, on any machine
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(base + text)
        result = _train_command(
            "Train", "--config", str(tmp_path / name), "--local-scheduler", cwd=ROOT, env=env
        )
        assert result.returncode == 2, (name, result.stderr)
        line = _one_line(result.stderr)
        assert line.startswith("error: ") and expected in line, (name, line)
        assert not work.exists(), name
    plain = _plain_luigi("Export", "--config", str(tmp_path / "hooks.yaml"), "--local-scheduler")
    assert plain.returncode == 2 and "training.hooks: no module" in _one_line(plain.stderr), plain.stderr
    assert not work.exists()


def test_the_towers_train_will_have_are_counted_as_its_strategy_counts_them(tmp_path):
    """What the global-batch check of deepspeech-train divides by, without TensorFlow: make_strategy's rule;
    and the check applies only to a command that runs Train (here: not FeaturesSplit)."""
    import dataclasses

    from pipeline.config_loader import load_config
    from tasks.preflight import PreflightError, check_training, train_towers

    path = tmp_path / "c.yaml"
    path.write_text(f"paths:\n  work_dir: {tmp_path / 'work'}\n")
    config = load_config(path)

    def towers(gpus: int, **distribution) -> int:
        changed = dataclasses.replace(
            config, distribution=dataclasses.replace(config.distribution, **distribution)
        )
        return train_towers(changed, gpus, environ={})[0]

    assert [towers(0), towers(1), towers(4)] == [1, 1, 4]  # auto: several GPUs mirrored, else one device
    assert [towers(0, cpu_devices=3), towers(2, cpu_devices=3)] == [3, 2]
    assert towers(4, strategy="one_device") == 1
    assert [towers(0, strategy="mirrored"), towers(2, strategy="mirrored")] == [1, 2]
    assert towers(0, strategy="multi_worker", local_workers=3) == 3
    assert towers(2, strategy="multi_worker", local_workers=3) == 6
    cluster = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"index": 0}})}
    multi = dataclasses.replace(
        config, distribution=dataclasses.replace(config.distribution, strategy="multi_worker")
    )
    assert train_towers(multi, 1, environ=cluster)[0] == 2

    odd = dataclasses.replace(config, training=dataclasses.replace(config.training, global_batch_size=5))
    check_training(odd, "Train", gpus=1)  # one device: 5 splits
    check_training(odd, "FeaturesSplit", gpus=4)  # does not run Train
    with pytest.raises(PreflightError, match="5 does not split over the 4 towers"):
        check_training(odd, "Evaluate", gpus=4)  # runs Train first (not done)


def _plain_luigi(*args, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``luigi --module tasks ...`` as a user types it in the checkout (luigi.cfg read from there)."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from luigi.cmdline import luigi_run; luigi_run()",
            "--module",
            "tasks",
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_plain_luigi_checks_the_config_once_before_scheduling(tmp_path):
    """Issue 26 L6: `luigi --module tasks Features --config bad.yaml` printed 34 lines (the error seven
    times, three UnconsumedParameterWarnings about luigi.cfg's rpc-* keys, failed tasks, a summary);
    the --config parameter now checks the config when parsed: one line, exit status 2, nothing written.
    A good config runs without warnings about the project's own luigi.cfg."""
    work = tmp_path / "work"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"extends: {ROOT / 'configs' / 'sample.yaml'}\npaths:\n  work_dir: {work}\ntraining:\n  epoch: 3\n"
    )
    result = _plain_luigi("Features", "--config", str(bad), "--local-scheduler")
    assert result.returncode == 2, result.stderr
    assert not result.stdout.strip()
    line = _one_line(result.stderr)
    assert line.startswith(f"error: {bad}: training.epoch: unknown key; did you mean 'epochs'?"), line
    assert not work.exists()
    good = tmp_path / "good.yaml"
    good.write_text(
        f"extends: {ROOT / 'configs' / 'sample.yaml'}\npaths:\n  work_dir: {work}\n"
        "data:\n  limit_dev: 3\nfeatures:\n  workers: 1\n"
    )
    result = _plain_luigi("FeaturesSplit", "--split", "dev", "--config", str(good), "--local-scheduler")
    assert result.returncode == 0, result.stderr
    assert "UnconsumedParameterWarning" not in result.stderr and "not consumed" not in result.stderr


def test_the_same_command_twice_at_once_says_so_in_one_line(tmp_path):
    """Issue 26 N10: the same deepspeech-train command started while it runs ended with only Luigi's
    "Pid(s) {...} already running"; now one line says what runs and what to do (exit status 10, Luigi's
    already_running)."""
    import os
    import signal
    import time

    work = tmp_path / "work"
    config = tmp_path / "long.yaml"
    config.write_text(
        f"extends: {ROOT / 'configs' / 'sample.yaml'}\npaths:\n  work_dir: {work}\nfeatures:\n  workers: 1\n"
    )
    command = [
        sys.executable,
        "-m",
        "tasks.cli",
        "FeaturesSplit",
        "--split",
        "train",
        "--config",
        str(config),
        "--local-scheduler",
    ]
    first = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not list((work / "features").glob("*.parts")) and time.monotonic() < deadline:
            assert first.poll() is None
            time.sleep(0.2)
        # Frozen once it is writing features: it runs (holds its lock) however fast this CPU finishes it.
        os.killpg(first.pid, signal.SIGSTOP)
        second = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert first.poll() is None, "the first run ended before the second started"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert second.returncode == 10, second.stderr
    assert "Pid(s)" not in second.stdout, second.stderr
    line = _one_line(second.stderr)
    assert line.startswith(f"error: the same command is already running (pid {first.pid});"), line


def test_no_scheduler_is_one_line_naming_the_fix(tmp_path):
    """Without --local-scheduler and with no luigid listening: one line, not 241 lines of RPC traceback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed
    config = tmp_path / "ok.yaml"
    config.write_text(
        f"paths:\n  work_dir: {tmp_path / 'work'}\ndata:\n  train_files: [{SAMPLE / 'train.csv'}]\n"
    )
    result = _train_command(
        "FeaturesSplit",
        "--split",
        "train",
        "--config",
        str(config),
        "--scheduler-port",
        str(port),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert (
        f"no Luigi scheduler at 127.0.0.1:{port}" in line
        and "make scheduler" in line
        and "--local-scheduler" in line
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The project's wheel installed into a fresh target directory (its dependencies from this venv)."""
    root = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(root / "dist"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((root / "dist").glob("*.whl"))
    target = root / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return target


@pytest.mark.slow
def test_the_installed_commands_work_from_an_empty_directory(installed, tmp_path):
    """deepspeech-train and deepspeech-transcribe from the wheel, run in an empty directory (no luigi.cfg,
    no checkout on the path): the DAG to Export on a tiny config, word timings from the .tflite, and a
    failing task's non-zero exit code from the packaged luigi.cfg's [retcode] table."""
    import os

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(installed), "LUIGI_CONFIG_PATH": ""}
    env.pop("LUIGI_CONFIG_PATH")
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tasks, pipeline.layout as l; print(tasks.__file__); print(l.DEFAULT_ALPHABET)",
        ],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.splitlines()[0].startswith(str(installed)), where.stdout + where.stderr
    assert where.stdout.splitlines()[1].startswith(str(installed))  # the alphabet is package data
    config = tmp_path / "tiny.yaml"
    config.write_text(
        textwrap.dedent(f"""
        paths:
          work_dir: {tmp_path / "work"}
        data:
          train_files: [{SAMPLE / "train.csv"}]
          dev_files: [{SAMPLE / "dev.csv"}]
          test_files: [{SAMPLE / "test.csv"}]
          limit_train: 8
          limit_dev: 4
          limit_test: 4
        model:
          n_hidden: 16
        training:
          epochs: 1
          batch_size: 4
        decoder:
          lm_corpus_files: [{SAMPLE / "lm_corpus.txt"}]
          lm_builder: python
    """)
    )
    train = installed / "bin" / "deepspeech-train"
    run = subprocess.run(
        [str(train), "Export", "--config", str(config), "--local-scheduler"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Validation after epoch 1" in run.stderr and "Exported " in run.stderr
    assert run.stderr.count("DEBUG") == 0 and "I0000" not in run.stderr
    assert "log of this run: " + str(tmp_path / "work" / "logs") in run.stderr
    assert list(empty.iterdir()) == []
    transcribe = subprocess.run(
        [
            str(installed / "bin" / "deepspeech-transcribe"),
            "--model",
            str(tmp_path / "work" / "export" / "model.tflite"),
            "--audio",
            str(SAMPLE / "test" / "00001.flac"),
            "--json",
        ],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert transcribe.returncode == 0, transcribe.stderr[-2000:]
    record = json.loads(transcribe.stdout)
    assert "words" in record["transcripts"][0] and record["duration_s"] > 1
    broken = tmp_path / "broken.csv"
    broken.write_text("wav_filename,transcript\nx.wav,hello\n")
    failing = tmp_path / "failing.yaml"
    failing.write_text(f"extends: {config}\ndata:\n  train_files: [{broken}]\n")
    failed = subprocess.run(
        [str(train), "FeaturesSplit", "--split", "train", "--config", str(failing), "--local-scheduler"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failed.returncode == 30, failed.stderr[-3000:]
    assert "header lacks column(s) wav_filesize" in failed.stderr
    assert "Traceback" not in failed.stderr
