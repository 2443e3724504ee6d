"""Clusters launched by Slurm and Kubernetes (issue 36, 5 and 6): a faked 2-task Slurm step on 127.0.0.1
trains a tiny model with 2 workers through TensorFlow's SlurmClusterResolver; the TFJob manifest's
TF_CONFIG per pod
is what the multi_worker path takes, and a missing shared work directory is refused in one line."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.config import ConfigError
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.locks import lock_path
from pipeline.train.cluster import check_shared_work_dir, slurm_port_base, slurm_tf_config
from pipeline.train.distribute import cluster_role
from pipeline.train.multiworker import worker_result
from tests.conftest import ROOT, build_features
from tests.plugins.step_barrier import StepBarrier

SBATCH = ROOT / "configs" / "slurm.sbatch"
TFJOB = ROOT / "configs" / "k8s-tfjob.yaml"


def _two_free_ports() -> int:
    """A port p such that p and p + 1 are free on 127.0.0.1 (a node's two Slurm tasks take both)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", base))
                second.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise AssertionError("no two consecutive free ports")


def _slurm_step(rank: int, tasks: int = 2, job: str = "4242") -> dict:
    """The variables Slurm sets for task ``rank`` of a job step of ``tasks`` tasks on one node."""
    return {
        "SLURM_JOB_ID": job,
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NTASKS": str(tasks),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NODELIST": "127.0.0.1",
        "SLURM_STEP_TASKS_PER_NODE": str(tasks),
        "SLURM_NODEID": "0",
    }


def test_slurm_tf_config_on_cpu_and_gpu_nodes():
    """The resolver's quirks: on a CPU-only step it gets one pretend GPU per task and leaves
    CUDA_VISIBLE_DEVICES alone; a node's GPUs are split by their ids; port_base 0 follows the job id."""
    from pipeline.config import DistributionConfig

    distribution = DistributionConfig(strategy="multi_worker", cluster="slurm")
    for rank in (0, 1):
        raw, changes = slurm_tf_config(distribution, _slurm_step(rank))
        spec = json.loads(raw)
        base = 20000 + 8 * (4242 % 1500)
        assert spec == {
            "cluster": {"worker": [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]},
            "task": {"type": "worker", "index": rank},
        }
        assert changes == {}
        _, changes = slurm_tf_config(distribution, {**_slurm_step(rank), "CUDA_VISIBLE_DEVICES": "2,3,4,5"})
        assert changes == {"CUDA_VISIBLE_DEVICES": ["2,3", "4,5"][rank]}
        _, changes = slurm_tf_config(distribution, {**_slurm_step(rank), "CUDA_VISIBLE_DEVICES": "0"})
        assert changes == {}  # Slurm gave each task its own GPU
    # every job id's ports stay below Linux's ephemeral range (32768-60999)
    highest = max(slurm_port_base(distribution, {"SLURM_JOB_ID": str(job)}) for job in range(4000)) + 7
    assert highest < 32768
    with pytest.raises(Exception, match="SLURM_PROCID.*is not set: start Train with srun"):
        slurm_tf_config(distribution, {})


def test_a_port_base_beyond_the_last_port_is_one_line_naming_the_key(tmp_path):
    """Issue 42 G12: distribution.port_base had no maximum (70000 loaded, and TensorFlow was handed ports that
    do not exist). Above 65535 the config is refused; a base whose node's tasks run past 65535 is refused
    when the Slurm step's tasks per node are known (65535 with 2 tasks would give the second 65536)."""
    from pipeline.config import DistributionConfig

    config = tmp_path / "ports.yaml"
    config.write_text("distribution:\n  strategy: multi_worker\n  cluster: slurm\n  port_base: 70000\n")
    with pytest.raises(ConfigError) as error:
        load_config(config)
    message = str(error.value)
    assert "distribution.port_base" in message and "65535" in message and "\n" not in message, message

    config.write_text("distribution:\n  strategy: multi_worker\n  cluster: slurm\n  port_base: 65534\n")
    assert load_config(config).distribution.port_base == 65534
    last = DistributionConfig(strategy="multi_worker", cluster="slurm", port_base=65535)
    with pytest.raises(ConfigError) as error:
        slurm_tf_config(last, _slurm_step(0, tasks=2))
    message = str(error.value)
    assert message.startswith(
        "distribution.port_base: 65535 with 2 task(s) on a node needs ports 65535-65536"
    )
    assert "at most 65534" in message and "\n" not in message, message
    fits = DistributionConfig(strategy="multi_worker", cluster="slurm", port_base=65534)
    spec = json.loads(slurm_tf_config(fits, _slurm_step(1, tasks=2))[0])
    assert spec["cluster"]["worker"] == ["127.0.0.1:65534", "127.0.0.1:65535"]


@pytest.mark.slow
def test_a_faked_two_task_slurm_step_trains_with_two_workers(small_config, tmp_path):
    """Two `deepspeech-train Train` processes, each with the Slurm variables of its task in a 2-task step on
    127.0.0.1 (as `srun` in configs/slurm.sbatch starts them), and distribution.cluster: slurm: they find
    each other through SlurmClusterResolver and train one model, ending with the same weights."""
    port = _two_free_ports()
    path = small_config(
        "slurm.yaml",
        limit_train=16,
        limit_dev=4,
        limit_test=4,
        extra=f"""
distribution:
  strategy: multi_worker
  cluster: slurm
  port_base: {port}
  collective_timeout_s: 30
training:
  epochs: 2
  batch_size: 4
  validation_epochs: 1000
""",
    )
    config = load_config(path)
    build_features(config, ("train", "dev"))
    run = Layout(config).train_run
    command = [
        sys.executable,
        "-m",
        "tasks.cli",
        "Train",
        "--config",
        str(path),
        "--local-scheduler",
        "--no-lock",
    ]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "TF_CONFIG"}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    tasks = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env={**environment, **_slurm_step(rank), "CUDA_VISIBLE_DEVICES": ""},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [task.communicate(timeout=900) for task in tasks]
    finally:
        for task in tasks:
            task.kill()
    for task, (_, stderr) in zip(tasks, outputs, strict=True):
        assert task.returncode == 0, stderr[-3000:]
    results = [worker_result(run.worker_log(rank)) for rank in (0, 1)]
    assert [r["worker"] for r in results] == [0, 1]
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    report = json.loads(run.report.read_text())
    assert (
        report["weights_sha256"] == results[0]["weights_sha256"]
        and report["global_step"] == results[0]["global_step"]
    )


def _sbatch_train_command(config: Path) -> list[str]:
    """configs/slurm.sbatch's Train command line as srun runs it in each task (srun and its options off),
    with this environment's deepspeech-train."""
    line = next(
        line for line in SBATCH.read_text().splitlines() if line.startswith("srun ") and " Train " in line
    )
    words = shlex.split(line.rstrip("& "))[1:]
    words = words[next(i for i, word in enumerate(words) if not word.startswith("-")) :]
    program = Path(sys.executable).with_name(words[0])
    return [str(program), *(str(config) if word == "$CONFIG" else word for word in words[1:])]


def _process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it now, the deepest first."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, level = [], [pid]
    while level:
        found.extend(level)
        level = [child for parent in level for child in children.get(parent, [])]
    return found[::-1]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.long
@pytest.mark.slow
def test_sigterm_to_a_faked_slurm_step_stops_both_workers_after_one_step_with_its_checkpoint(
    small_config, tmp_path
):
    """Issue 42 G6: configs/slurm.sbatch passes the SIGTERM of a near time limit or a preemption to srun,
    which signals every process of the job step; Train's worker, a child process of the task, died at once
    and the requeued job lost the training since the last checkpoint. Two tasks of a faked 2-task step on
    127.0.0.1 run the template's Train command line, paused after step 8 (6 steps per epoch) when every
    process of the step gets SIGTERM, deepest first: both workers stop after step 10 with its checkpoint,
    each task fails saying so, and no process of the step is left, nor the run's lock held."""
    port = _two_free_ports()
    barrier = StepBarrier(tmp_path / "barrier", 8)
    path = small_config(
        "slurm_term.yaml",
        limit_train=48,
        limit_dev=4,
        limit_test=4,
        extra=f"""
distribution:
  strategy: multi_worker
  cluster: slurm
  port_base: {port}
  collective_timeout_s: 60
training:
  epochs: 3
  batch_size: 4
  checkpoint_secs: 100000
  max_to_keep: 1000
  validation_epochs: 1000
{barrier.config_yaml()}""",
    )
    config = load_config(path)
    build_features(config, ("train", "dev"))  # the template's Features step
    run = Layout(config).train_run
    environment = {k: v for k, v in barrier.env().items() if not k.startswith("SLURM_") and k != "TF_CONFIG"}
    outputs = [tmp_path / f"task-{rank}.err" for rank in (0, 1)]
    tasks, step, logs = [], [], [run.worker_log(rank) for rank in (0, 1)]
    try:
        for rank in (0, 1):
            with open(outputs[rank], "w") as stderr:
                tasks.append(
                    subprocess.Popen(
                        _sbatch_train_command(path),
                        cwd=tmp_path,
                        env={**environment, **_slurm_step(rank), "CUDA_VISIBLE_DEVICES": ""},
                        stdout=subprocess.DEVNULL,
                        stderr=stderr,
                    )
                )
        barrier.wait(
            8,
            lambda: all(t.poll() is None for t in tasks) or [o.read_text()[-2000:] for o in outputs],
            count=2,
        )
        step = [pid for task in tasks for pid in _process_tree(task.pid)]
        assert len(step) >= 6, step  # each task: deepspeech-train, its Train process, the worker
        for pid in step:  # as Slurm signals the processes of a step
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 120
        while not all("training stops after this step" in log.read_text() for log in logs):
            assert time.monotonic() < deadline, [log.read_text()[-2000:] for log in logs]
            time.sleep(0.05)
        barrier.release(8)
        codes = [task.wait(timeout=300) for task in tasks]
    finally:
        for pid in step:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        for task in tasks:
            task.kill()
            task.wait()
    texts = [output.read_text() for output in outputs]
    assert all(code != 0 for code in codes), texts
    for text in texts:
        stopped = re.search(
            r"training stopped by SIG.*? after step (\d+); a checkpoint of that step was", text
        )
        assert stopped and int(stopped.group(1)) == 10, text[-3000:]
    results = [worker_result(log) for log in logs]
    assert [(r["worker"], r["global_step"]) for r in results] == [(0, 10), (1, 10)], results
    assert (run.checkpoints / "ckpt-10.index").is_file()
    assert (run.worker_scratch(1).checkpoints / "ckpt-10.index").is_file()
    assert not [pid for pid in step if _running(pid)]
    with open(lock_path(run.root)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the run's lock is free


def test_the_sbatch_template_runs_train_under_srun():
    text = SBATCH.read_text()
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --ntasks-per-node" in text
    srun = [line for line in text.splitlines() if line.strip().startswith("srun ") and " Train " in line]
    assert srun and "deepspeech-train Train" in srun[0] and "--no-lock" in srun[0]
    assert "--local-scheduler" in srun[0]
    result = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _tfjob() -> tuple[dict, dict]:
    """(the TFJob, the ConfigMap holding its config) of configs/k8s-tfjob.yaml."""
    documents = [d for d in yaml.safe_load_all(TFJOB.read_text()) if d]
    kinds = {d["kind"]: d for d in documents}
    return kinds["TFJob"], kinds["ConfigMap"]


def _pod_tf_configs(job: dict) -> list[str]:
    """The TF_CONFIG Kubeflow's training operator gives each worker pod of ``job``: every replica's service
    ``<job>-worker-<i>.<namespace>.svc:<tfjob-port>``, and the pod's own type and index."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    container = next(c for c in worker["template"]["spec"]["containers"] if c["name"] == "tensorflow")
    port = next(p["containerPort"] for p in container.get("ports", []) if p["name"] == "tfjob-port")
    hosts = [f"{name}-worker-{i}.{namespace}.svc:{port}" for i in range(worker["replicas"])]
    return [
        json.dumps(
            {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}, "environment": "cloud"}
        )
        for i in range(worker["replicas"])
    ]


def test_the_tfjob_manifest_gives_each_pod_a_tf_config_the_multi_worker_path_takes(tmp_path, monkeypatch):
    job, config_map = _tfjob()
    assert job["apiVersion"] == "kubeflow.org/v1"
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    pod = worker["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "tensorflow")
    assert (
        container["command"][:2] == ["deepspeech-train", "Train"]
        and "--local-scheduler" in container["command"]
    )
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    shared = next(name for name, v in volumes.items() if "persistentVolumeClaim" in v)
    config_text = next(iter(config_map["data"].values()))
    settings = yaml.safe_load(config_text)
    assert settings["paths"]["work_dir"] == mounts[shared]
    assert settings["distribution"]["strategy"] == "multi_worker"
    config_path = mounts[next(name for name, v in volumes.items() if "configMap" in v)]
    assert container["command"][container["command"].index("--config") + 1].startswith(config_path)

    # The pod's config, with the shared volume's mount point here: a tmp directory.
    mounted = tmp_path / "work"
    settings["paths"]["work_dir"] = str(mounted)
    settings.pop("data", None)
    settings["data"] = {"train_files": [str(ROOT / "data" / "sample" / "train.csv")]}
    local = tmp_path / "pod.yaml"
    local.write_text(yaml.safe_dump(settings))
    config = load_config(local)
    pods = _pod_tf_configs(job)
    assert len(pods) == worker["replicas"] >= 2
    for index, tf_config in enumerate(pods):
        monkeypatch.setenv("TF_CONFIG", tf_config)
        role = cluster_role()
        assert (role.index, role.count, role.is_chief) == (index, len(pods), index == 0)
        with pytest.raises(ConfigError) as refused:
            check_shared_work_dir(config)  # the volume is not mounted: no work directory
        message = str(refused.value)
        assert "\n" not in message and f"paths.work_dir {mounted} does not exist" in message
        mounted.mkdir(exist_ok=True)
        check_shared_work_dir(config)
        mounted.rmdir()


def test_a_cluster_train_without_its_shared_work_dir_is_refused_before_it_starts(tmp_path):
    """deepspeech-train's check before scheduling: one line, exit 2, nothing created."""
    config = tmp_path / "pod.yaml"
    work = tmp_path / "not-mounted"
    config.write_text(
        f"paths:\n  work_dir: {work}\ndata:\n  train_files: [{ROOT / 'data' / 'sample' / 'train.csv'}]\n"
        "distribution:\n  strategy: multi_worker\n"
    )
    job, _ = _tfjob()
    env = {**os.environ, "TF_CONFIG": _pod_tf_configs(job)[1]}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "Train", "--config", str(config), "--local-scheduler"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "paths.work_dir" in lines[0] and "does not exist" in lines[0], result.stderr
    assert not work.exists()
    assert Path(config).is_file()


def test_slurm_template_stops_train_and_requeues_on_the_time_limit_signal(tmp_path):
    """configs/slurm.sbatch: the SIGTERM Slurm sends the batch script before the time limit (--signal=B:)
    reaches Train (srun forwards it) and the script requeues the job, which Slurm never does by itself
    at the time limit. srun and scontrol are stand-ins that record what they are asked to do."""
    import signal
    import time

    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "activate").write_text("")
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n"
        f'echo "srun $*" >> {record}\n'
        'case "$*" in *" Train "*) ;; *) exit 0;; esac\n'
        f"trap 'echo train-stopped-by-TERM >> {record}; exit 143' TERM\n"
        f"touch {tmp_path}/train-started\n"
        "while :; do sleep 0.05; done\n"
    )
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "scontrol $*" >> {record}\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VENV": str(tmp_path / "venv")}
    env["SLURM_JOB_ID"] = "4242"
    with open(tmp_path / "out", "wb") as out:
        script = subprocess.Popen(
            ["bash", str(ROOT / "configs" / "slurm.sbatch"), "my.yaml"], env=env, stdout=out, stderr=out
        )
        try:
            while not (tmp_path / "train-started").exists():  # waits for a state, not a moment
                assert script.poll() is None, (tmp_path / "out").read_text()
                time.sleep(0.05)
            script.send_signal(signal.SIGTERM)
            assert script.wait(timeout=60) == 0, (tmp_path / "out").read_text()
        finally:
            if script.poll() is None:
                script.kill()
    lines = record.read_text().splitlines()
    assert lines[0].startswith("srun --nodes=1 --ntasks=1 deepspeech-train Features --config my.yaml")
    assert lines[1].startswith("srun --kill-on-bad-exit=1 deepspeech-train Train --config my.yaml")
    assert lines[2:] == ["train-stopped-by-TERM", "scontrol requeue 4242"], lines
    assert "#SBATCH --signal=B:TERM@300" in (ROOT / "configs" / "slurm.sbatch").read_text()
