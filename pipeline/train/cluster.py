"""Where a multi-worker Train learns its cluster: ``TF_CONFIG``, or the Slurm job step it runs in.

``distribution.cluster: slurm`` (never guessed: every sbatch job has ``SLURM_*``
variables, also a training alone) builds ``TF_CONFIG`` from the step's variables
through TensorFlow's ``SlurmClusterResolver``, with two of its quirks handled:

- GPU counts: left unset, it runs ``nvidia-smi`` (missing on a CPU node: an
  uncaught FileNotFoundError), and with 0 GPUs its allocation loop steps by 0
  (ValueError) or gives no task an address. On a CPU-only step it is given one
  "GPU" per task and told not to touch ``CUDA_VISIBLE_DEVICES``; with GPUs, the
  node's visible GPUs are split between its tasks here, by their ids in
  ``CUDA_VISIBLE_DEVICES`` (the resolver would write ids counted from 0), unless
  Slurm already gave each task its own (``--gpus-per-task``).
- ``port_base``: its default, 8888 on every node, collides between two jobs on
  one node; ``distribution.port_base``, default derived from ``SLURM_JOB_ID``.

A cluster of several machines needs ``paths.work_dir`` on a filesystem they share
(the chief writes checkpoints and the report there, the other workers' Train
tasks wait for that report): ``check_shared_work_dir`` refuses a work directory
that does not exist yet, as a volume that is not mounted would look.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.config import Config, ConfigError, DistributionConfig

# What Slurm sets for each task of a job step (srun), and what the resolver reads.
SLURM_STEP_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)


# The default ports of a Slurm job: 8 per job (the tasks of one node), 1500 jobs apart, all below 32768.
PORT_BASE_FIRST, PORT_BASE_STRIDE, PORT_BASE_JOBS = 20000, 8, 1500
MAX_PORT = 65535


def slurm_port_base(distribution: DistributionConfig, environ: dict) -> int:
    """``distribution.port_base``, or 20000 + 8 x (SLURM_JOB_ID mod 1500) when it is 0: at most 31999 with
    up to 8 tasks per node, below Linux's ephemeral ports (32768-60999, which the kernel hands out to
    outgoing connections and could already hold)."""
    if distribution.port_base:
        return distribution.port_base
    return PORT_BASE_FIRST + PORT_BASE_STRIDE * (int(environ.get("SLURM_JOB_ID", "0") or 0) % PORT_BASE_JOBS)


def check_node_ports(base: int, per_node: int) -> None:
    """ConfigError in one line naming ``distribution.port_base`` when the ports of a node's ``per_node``
    tasks (``base`` and the ones after it, as the Slurm resolver gives them) do not fit in 1-65535."""
    last = base + per_node - 1
    if base < 1 or last > MAX_PORT:
        raise ConfigError(
            f"distribution.port_base: {base} with {per_node} task(s) on a node needs ports {base}-{last}, "
            f"beyond {MAX_PORT}; set it to at most {MAX_PORT + 1 - per_node} (or 0: derived from the job id)"
        )


def _visible_gpu_ids(environ: dict) -> list[str]:
    ids = [item.strip() for item in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    return [] if ids[:1] == ["-1"] else ids


def slurm_tf_config(distribution: DistributionConfig, environ: dict | None = None) -> tuple[str, dict]:
    """(the ``TF_CONFIG`` of this task of the Slurm step, environment changes it needs: its
    ``CUDA_VISIBLE_DEVICES``). DistributionError in one line when this is not a task of a Slurm step."""
    from pipeline.train.distribute import DistributionError  # imports TensorFlow

    environ = dict(os.environ if environ is None else environ)
    missing = [name for name in SLURM_STEP_VARIABLES if not environ.get(name)]
    if missing:
        raise DistributionError(
            f"distribution.cluster is slurm but {', '.join(missing)} is not set: start Train with srun "
            f"inside a Slurm job (configs/slurm.sbatch)"
        )
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as slurm

    per_node = max(slurm.expand_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"]))
    check_node_ports(slurm_port_base(distribution, environ), per_node)
    gpu_ids = _visible_gpu_ids(environ)
    changes = {}
    if not gpu_ids:  # CPU only: one pretend GPU per task, and CUDA_VISIBLE_DEVICES left alone
        gpus_per_node, gpus_per_task = per_node, 1
    elif len(gpu_ids) < per_node:  # Slurm gave each task its own GPUs (--gpus-per-task)
        gpus_per_node, gpus_per_task = per_node * len(gpu_ids), len(gpu_ids)
    else:  # the node's GPUs, split between its tasks in local-rank order
        gpus_per_node, gpus_per_task = len(gpu_ids), len(gpu_ids) // per_node
        local = int(environ.get("SLURM_LOCALID", "0"))
        changes["CUDA_VISIBLE_DEVICES"] = ",".join(
            gpu_ids[local * gpus_per_task : (local + 1) * gpus_per_task]
        )
    saved = {name: os.environ.get(name) for name in SLURM_STEP_VARIABLES}
    os.environ.update({name: environ[name] for name in SLURM_STEP_VARIABLES})
    try:
        resolver = slurm.SlurmClusterResolver(
            port_base=slurm_port_base(distribution, environ),
            gpus_per_node=gpus_per_node,
            gpus_per_task=gpus_per_task,
            auto_set_gpu=False,
        )
        spec = resolver.cluster_spec().as_dict()
        kind, index = resolver.get_task_info()
    except (RuntimeError, ValueError) as error:
        raise DistributionError(
            f"distribution.cluster slurm: the Slurm step cannot be resolved ({error})"
        ) from None
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return json.dumps({"cluster": spec, "task": {"type": kind, "index": index}}), changes


def cluster_size(config: Config, environ: dict | None = None) -> int:
    """How many processes the multi-worker cluster this Train would join has (1: none, or local workers)."""
    environ = os.environ if environ is None else environ
    distribution = config.distribution
    if distribution.strategy != "multi_worker" or distribution.local_workers:
        return 1
    if distribution.cluster == "slurm":
        return int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or 1)
    try:
        cluster = json.loads(environ.get("TF_CONFIG") or "{}").get("cluster", {})
        return sum(len(addresses) for addresses in cluster.values()) or 1
    except (ValueError, AttributeError):
        return 1  # cluster_role gives the one-line error


def check_shared_work_dir(config: Config, environ: dict | None = None) -> None:
    """In a cluster of several machines, ``paths.work_dir`` must already exist: the shared volume every
    worker mounts there (a directory made here would be this machine's alone). ConfigError in one line."""
    if cluster_size(config, environ) <= 1:
        return
    work_dir = config.paths.work_dir
    if not work_dir or not Path(work_dir).is_dir():
        raise ConfigError(
            f"{config.source}: paths.work_dir {work_dir or '(unset: the XDG data home)'} "
            f"{'does not exist' if work_dir else 'is not shared'}: a cluster's workers need it on a "
            f"filesystem they all mount (a shared volume, NFS) before training starts"
        )


def apply_cluster(config: Config) -> None:
    """Before a multi-worker Train: check the shared work directory, and with ``distribution.cluster:
    slurm`` set this process's ``TF_CONFIG`` (and ``CUDA_VISIBLE_DEVICES``) from the Slurm step."""
    check_shared_work_dir(config)
    distribution = config.distribution
    if (
        distribution.strategy == "multi_worker"
        and not distribution.local_workers
        and distribution.cluster == "slurm"
    ):
        try:
            tf_config, changes = slurm_tf_config(distribution)
        except ConfigError as error:
            raise ConfigError(f"{config.source}: {error}") from None
        os.environ.update(changes)
        os.environ["TF_CONFIG"] = tf_config
