"""Multi-worker training: two real worker processes on 127.0.0.1, each with its own TF_CONFIG."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

import pipeline.train.multiworker as multiworker
from pipeline.config_loader import load_config
from pipeline.layout import Layout, TrainRun
from pipeline.train.distribute import DistributionError
from pipeline.train.multiworker import wait_for_workers
from tests.conftest import build_features

pytestmark = pytest.mark.slow


def _config(small_config, name: str, epochs: int, extra: str = "") -> Path:
    return small_config(
        name,
        limit_train=16,
        limit_dev=4,
        limit_test=4,
        extra=f"""
distribution:
  strategy: multi_worker
  collective_timeout_s: 20
training:
  epochs: {epochs}
  batch_size: 4
  validation_epochs: 1000
  checkpoint_secs: 1
"""
        + extra,
    )


@pytest.fixture(autouse=True)
def no_orphans(monkeypatch):
    """Kill any worker a test started and left running (a failed assertion must not leave training on)."""
    import pipeline.train.multiworker as multiworker

    started = []
    real = multiworker.start_workers

    def tracking(*args, **kwargs):
        processes = real(*args, **kwargs)
        started.extend(processes)
        return processes

    monkeypatch.setattr(multiworker, "start_workers", tracking)
    yield
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def _result(log: Path) -> dict:
    """The worker's result line (its last JSON line: gRPC may log a line after it when the peer that
    finished first has already closed its server)."""
    lines = [line for line in log.read_text().splitlines() if line.startswith('{"worker"')]
    assert lines, log.read_text()[-2000:]
    return json.loads(lines[-1])


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> str:
    """A /proc/net/tcp{,6} address (little-endian 32-bit words) as text."""
    words = [bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8)]
    raw = b"".join(words)
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def _listeners(pids: list[int]) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket the processes ``pids`` hold."""
    inodes = set().union(*(_socket_inodes(pid) for pid in pids))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:
                address, port = local.split(":")
                found.add((_address(address), int(port, 16)))
    return found


def test_two_workers_end_with_identical_weights(small_config, tmp_path):
    """Also: each worker's TensorFlow server listens on 127.0.0.1 only, never on every interface."""
    path = _config(small_config, "mw.yaml", epochs=2)
    config = load_config(path)
    build_features(config, ("train", "dev"))
    logs = TrainRun(tmp_path).worker_log
    processes = multiworker.start_workers(path, 2, logs)
    listening = set()
    while any(p.poll() is None for p in processes):
        listening |= _listeners([p.pid for p in processes])
        time.sleep(0.2)
    wait_for_workers(processes, logs, grace_s=60)
    assert len({port for _, port in listening}) >= 2, listening  # both servers were seen
    assert all(address in ("127.0.0.1", "::ffff:127.0.0.1") for address, _ in listening), listening
    chief, other = _result(logs(0)), _result(logs(1))
    assert chief["global_step"] == other["global_step"] == 4  # 16 samples / (2 workers x 4) x 2 epochs
    assert chief["weights_sha256"] == other["weights_sha256"]
    run_dir = Layout(config).train_run.root
    assert list((run_dir / "checkpoints").glob("ckpt-*.index")) and (run_dir / "train_report.json").is_file()
    assert not list(run_dir.glob(".worker-*"))  # the other worker's scratch saves are gone
    assert (
        json.loads((run_dir / "train_report.json").read_text())["weights_sha256"] == chief["weights_sha256"]
    )


def test_killed_worker_stops_the_other_and_a_restart_resumes(small_config, tmp_path):
    path = _config(small_config, "kill.yaml", epochs=40)
    config = load_config(path)
    build_features(config, ("train", "dev"))
    run_dir = Layout(config).train_run.root
    logs = TrainRun(tmp_path).worker_log
    workers = multiworker.start_workers(path, 2, logs)
    deadline = time.monotonic() + 300
    while not list((run_dir / "checkpoints").glob("ckpt-*.index")):
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers), logs(0).read_text()[
            -2000:
        ]
        time.sleep(0.5)
    time.sleep(2)
    workers[1].kill()
    started = time.monotonic()
    with pytest.raises(DistributionError) as failure:
        wait_for_workers(workers, logs, grace_s=120)
    assert time.monotonic() - started < 150  # stopped by the collective timeout, not hung
    assert workers[0].returncode == 3 and "lost contact with another worker" in logs(0).read_text()
    assert "worker 0 exit 3" in str(failure.value)

    logs2 = TrainRun(tmp_path / "restart").worker_log
    wait_for_workers(multiworker.start_workers(path, 2, logs2), logs2, grace_s=60)
    chief, other = _result(logs2(0)), _result(logs2(1))
    restored = [line for line in logs2(0).read_text().splitlines() if "Restored" in line]
    assert restored and "Restored" in logs2(1).read_text()
    assert int(restored[0].split("step ")[1].split()[0].rstrip(",")) > 0
    assert (
        chief["global_step"] == other["global_step"] == 80
        and chief["weights_sha256"] == other["weights_sha256"]
    )


@pytest.mark.usefixtures("tasks_in_process")
def test_train_task_launches_local_workers(small_config):
    import luigi

    from tasks import Train

    path = _config(small_config, "local.yaml", epochs=1)
    path.write_text(
        path.read_text().replace(
            "  collective_timeout_s: 20\n", "  collective_timeout_s: 20\n  local_workers: 2\n"
        )
    )
    assert luigi.build([Train(config=str(path))], local_scheduler=True)
    config = load_config(path)
    run_dir = Layout(config).train_run.root
    report = json.loads((run_dir / "train_report.json").read_text())
    assert report["global_step"] == 2 and sorted(p.name for p in (run_dir / "logs").iterdir()) == [
        "worker-0.log",
        "worker-1.log",
    ]
    assert _result(run_dir / "logs" / "worker-1.log")["weights_sha256"] == report["weights_sha256"]


@pytest.mark.usefixtures("tasks_in_process")
def test_workers_train_the_config_the_task_was_scheduled_with(small_config, monkeypatch):
    """Issue 26 M7: local workers read the YAML file again when they started; edited after scheduling, it
    made them train under another fingerprint while the task waited for the report of the scheduled one
    (a ReportError after the whole training). The task now hands the workers the config it was scheduled
    with, written as the run's resolved config."""
    import luigi

    import pipeline.train.multiworker as multiworker
    from tasks import Train

    path = _config(small_config, "edited.yaml", epochs=1)
    path.write_text(path.read_text().replace(
        "  collective_timeout_s: 20\n", "  collective_timeout_s: 20\n  local_workers: 2\n"))
    scheduled = load_config(path)
    launch = multiworker.launch_local_workers

    def edit_then_launch(*args, **kwargs):  # the user edits the file while the task starts
        path.write_text(path.read_text() + "model:\n  n_hidden: 40\n")
        return launch(*args, **kwargs)

    monkeypatch.setattr(multiworker, "launch_local_workers", edit_then_launch)
    task = Train(config=str(path))
    assert luigi.build([task], local_scheduler=True)
    run = Layout(scheduled).train_run
    assert json.loads(run.report.read_text())["global_step"] == 2
    assert load_config(run.resolved_config).model.n_hidden == scheduled.model.n_hidden
    edited = Layout(load_config(path)).train_run.root
    assert edited != run.root and not edited.exists()
