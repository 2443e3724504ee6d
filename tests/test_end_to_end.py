"""The whole DAG on a real central scheduler (luigid on a free loopback port), checked through its HTTP API.

Run alone with ``pytest -m end_to_end``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.train.multiworker import free_ports
from tests.conftest import ROOT, SAMPLE
from tests.plugins.step_barrier import StepBarrier

pytestmark = [pytest.mark.end_to_end, pytest.mark.slow]
BIN = Path(sys.executable).parent
CLIP = SAMPLE / "test" / "00004.flac"


def _api(port: int, method: str, **data) -> dict:
    query = urllib.parse.urlencode({"data": json.dumps(data)})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/{method}?{query}", timeout=10) as response:
        return json.loads(response.read())["response"]


@pytest.fixture
def luigid(tmp_path):
    """A luigid on a free port (it reads luigi.cfg); yields the port."""
    port = free_ports(1)[0]
    process = _start_luigid(port, tmp_path / "luigid")
    yield port
    process.terminate()
    process.wait(10)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.long
def test_dag_to_transcribe_on_luigid_then_rerun_train_keeps_features(small_config, tmp_path, luigid):
    path = small_config(
        limit_train=16,
        limit_dev=4,
        limit_test=4,
        extra=f"""
paths:
  export_dir: {tmp_path / "export"}
training:
  epochs: 2
decoder:
  beam_width: 16
""",
    )
    scheduler = ["--scheduler-host", "127.0.0.1", "--scheduler-port", str(luigid)]
    run = subprocess.run(
        [
            str(BIN / "luigi"),
            "--module",
            "tasks",
            "Transcribe",
            "--config",
            str(path),
            "--audio",
            str(CLIP),
            *scheduler,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "hypothesis: " in run.stdout

    done = _api(luigid, "task_list", status="DONE", upstream_status="", search="")
    families = sorted(task["name"] for task in done.values())
    assert families == ["Export", "FeaturesSplit", "FeaturesSplit", "LanguageModel", "Train", "Transcribe"]
    for status in ("FAILED", "PENDING", "RUNNING"):
        assert _api(luigid, "task_list", status=status, upstream_status="", search="") == {}
    by_name = {task["name"]: task for task in done.values()}
    for name in ("Train", "Export", "LanguageModel", "Transcribe"):
        assert by_name[name]["progress_percentage"] == 100 and by_name[name]["status_message"], name
    assert (
        "epochs" in by_name["Train"]["status_message"]
        and "exported to" in by_name["Export"]["status_message"]
    )
    assert all("kept" in t["status_message"] for t in done.values() if t["name"] == "FeaturesSplit")

    config = load_config(path)
    features = Layout(config).features_cache("train")
    before = (features.stat().st_mtime_ns, _digest(features))
    report = Layout(config).train_run.root / "train_report.json"
    report_before = report.stat().st_mtime_ns
    rerun = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks.rerun",
            "Train",
            "--config",
            str(path),
            "--audio",
            str(CLIP),
            *scheduler,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (
        f"removing {Layout(config).train_run.root}" in rerun.stdout
        and "removing " + str(features) not in rerun.stdout
    )
    assert (features.stat().st_mtime_ns, _digest(features)) == before
    assert report.stat().st_mtime_ns != report_before
    assert json.loads(report.read_text())["global_step"] == 8


def _start_luigid(port: int, state: Path) -> subprocess.Popen:
    """A luigid on ``port`` keeping its state in ``state``, answering when this returns."""
    state.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            str(BIN / "luigid"),
            "--address",
            "127.0.0.1",
            "--port",
            str(port),
            "--state-path",
            str(state / "state.pickle"),
            "--logdir",
            str(state),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            _api(port, "task_list", status="DONE", upstream_status="", search="")
            return process
        except OSError:
            assert time.monotonic() < deadline and process.poll() is None, "luigid did not start"
            time.sleep(0.3)


def _training_config(small_config, tmp_path, epochs: int, training: str = "") -> Path:
    return small_config(
        "scheduler.yaml",
        limit_train=64,
        limit_dev=4,
        limit_test=4,
        extra=f"paths:\n  export_dir: {tmp_path / 'export'}\ntraining:\n  epochs: {epochs}\n{training}"
        "decoder:\n  beam_width: 16\n",
    )


@pytest.mark.long
@pytest.mark.parametrize("restarted", [False, True])
def test_a_killed_luigid_never_costs_the_training_run(small_config, tmp_path, restarted):
    """Issue 26 N6: with luigid killed mid-epoch, Train's next progress call raised RPCError and the task
    failed (exit 40) without saving what it had trained since its last checkpoint, and the terminal showed
    six "--- Logging error ---" tracebacks; a luigid restarted within a second left Export "not granted run
    permission" (exit 25). Now progress goes to the scheduler from a thread and a scheduler that does not
    answer is one warning: training runs to its end. Killed for good, the run ends with one line saying
    what to do; restarted, deepspeech-train schedules the remaining stages again and the run completes."""
    barrier = StepBarrier(tmp_path / "barrier", 20)
    path = _training_config(small_config, tmp_path, epochs=12, training=barrier.config_yaml())
    port = free_ports(1)[0]
    luigid = _start_luigid(port, tmp_path / "luigid")
    task = "Export" if restarted else "Train"
    run = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli", task, "--config", str(path), "--scheduler-port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=barrier.env(),
    )
    second = None
    try:
        # luigid dies while training is paused after step 20 of 192 (mid-epoch), and stays dead or comes
        # back before training goes on.
        barrier.wait(20, lambda: run.poll() is None or run.stderr.read()[-3000:])
        luigid.kill()  # SIGKILL: luigid keeps no state
        luigid.wait()
        if restarted:
            second = _start_luigid(port, tmp_path / "luigid-again")
        barrier.release(20)
        out, err = run.communicate(timeout=900)
    finally:
        for process in (run, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert "Logging error" not in err
    report = Layout(load_config(path)).train_run.report
    assert report.is_file(), err[-3000:]
    assert json.loads(report.read_text())["global_step"] == 12 * 16
    if restarted:
        assert run.returncode == 0, err[-3000:]
        assert "scheduling them again" in err
        assert (tmp_path / "export" / "metadata.json").is_file()
    else:
        assert run.returncode == 40, err[-3000:]
        assert "the scheduler did not take this task's progress (RPCError" in err
        expected = f"error: the scheduler at 127.0.0.1:{port} stopped answering during the run; the stages"
        assert f"{expected} that finished are kept" in err
