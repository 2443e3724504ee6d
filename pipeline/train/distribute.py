"""Towers: choose the tf.distribute strategy from the config.

``one_device``: one GPU or the CPU. ``mirrored``: every local GPU (or the
logical CPU devices of ``cpu_devices``) as a tower, synchronous all-reduce.
``multi_worker``: MultiWorkerMirroredStrategy over the workers in
``TF_CONFIG``. ``auto``: mirrored over GPUs when there are several, else one
device (or the logical CPUs when ``cpu_devices`` > 1).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import tensorflow as tf

from pipeline.config import DistributionConfig

log = logging.getLogger(__name__)


class DistributionError(RuntimeError):
    """The requested devices or cluster cannot be set up."""


def configure_devices(config: DistributionConfig) -> None:
    """Let every GPU's memory grow as needed, and split the CPU into ``cpu_devices`` logical devices;
    must run before TensorFlow initialises its devices."""
    for gpu in tf.config.list_physical_devices("GPU"):
        # Taking all GPU memory up front leaves none to cuDNN's workspace: DeepSpeech's
        # "Failed to get convolution algorithm" (#2211).
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # devices already initialised (a second call in one process)
            pass
    if config.cpu_devices <= 1:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    wanted = [tf.config.LogicalDeviceConfiguration()] * config.cpu_devices
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) == len(wanted):
        return
    try:
        tf.config.set_logical_device_configuration(cpu, wanted)
    except RuntimeError as error:
        raise DistributionError(
            f"distribution.cpu_devices: cannot split the CPU after TensorFlow started ({error})"
        ) from error


@dataclass(frozen=True)
class ClusterRole:
    """This process's place in a cluster: its rank (0 = the chief), the number of processes, and whether
    it is the chief."""

    index: int
    count: int

    @property
    def is_chief(self) -> bool:
        """Rank 0 (the ``chief`` task when ``TF_CONFIG`` has one, else worker 0) writes checkpoints,
        summaries and reports."""
        return self.index == 0


SINGLE_PROCESS = ClusterRole(0, 1)


def cluster_role() -> ClusterRole:
    """This process's role from ``TF_CONFIG`` (a single process when it is unset).

    With a ``chief`` job, as TensorFlow's cluster specs allow, the chief is rank 0 and
    ``worker`` i is rank i + 1; without one, worker 0 is the chief (MultiWorkerMirroredStrategy's rule).
    """
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return SINGLE_PROCESS
    try:
        spec = json.loads(raw)
        cluster = spec["cluster"]
        chiefs = list(cluster.get("chief", []))
        workers = list(cluster.get("worker", []))
        task = spec["task"]
        kind, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DistributionError(
            "TF_CONFIG: expected {'cluster': {'worker': [...]}, 'task': {'type': 'worker', 'index': N}} "
            f"({error})"
        ) from error
    if kind not in ("worker", "chief"):
        raise DistributionError(f"TF_CONFIG: task type {kind!r} is not supported; use 'worker' (or 'chief')")
    if len(chiefs) > 1:
        raise DistributionError(f"TF_CONFIG: {len(chiefs)} chief tasks; a cluster has at most one")
    members = chiefs if kind == "chief" else workers
    if not 0 <= index < len(members):
        raise DistributionError(
            f"TF_CONFIG: task {kind} {index} is not in the cluster ({len(members)} {kind} addresses)"
        )
    rank = index if kind == "chief" else len(chiefs) + index
    return ClusterRole(rank, len(chiefs) + len(workers))


def training_role(config: DistributionConfig) -> ClusterRole:
    """The role training takes: ``TF_CONFIG``'s only with ``distribution.strategy: multi_worker``.

    With any other strategy a ``TF_CONFIG`` in the environment (a leftover of a cluster run) is ignored
    with a warning: taking a worker role there made a non-chief run train into a scratch folder and
    delete it.
    """
    if config.strategy == "multi_worker":
        return cluster_role()
    if os.environ.get("TF_CONFIG"):
        log.warning(
            "TF_CONFIG is set but distribution.strategy is %s, not multi_worker: TF_CONFIG is ignored and "
            "this process trains alone",
            config.strategy,
        )
    return SINGLE_PROCESS


def sum_over_workers(strategy: tf.distribute.Strategy, workers: int, values: list[float]) -> list[float]:
    """``values`` summed over the ``workers`` of a multi-worker run: one collective operation, which every
    worker must reach (each worker's first tower contributes its values, the others zeros)."""
    local = strategy.num_replicas_in_sync // workers

    def contribution(context: tf.distribute.ValueContext):
        first = context.replica_id_in_sync_group % local == 0
        return tf.constant([float(v) if first else 0.0 for v in values], tf.float64)

    per_tower = strategy.experimental_distribute_values_from_function(contribution)
    return [float(v) for v in strategy.reduce(tf.distribute.ReduceOp.SUM, per_tower, axis=None).numpy()]


def collective_implementation(gpus: bool) -> tf.distribute.experimental.CommunicationImplementation:
    """How multi-worker all-reduces travel: NCCL where the workers have GPUs (TensorFlow's AUTO picks the
    ring of gRPC messages there too, which moves every gradient through the hosts), the ring on CPUs."""
    kind = tf.distribute.experimental.CommunicationImplementation
    return kind.NCCL if gpus else kind.RING


def make_strategy(config: DistributionConfig) -> tf.distribute.Strategy:
    """Build the strategy named by ``distribution.strategy``.

    ``multi_worker`` must be built before anything else starts TensorFlow's
    runtime (listing devices does): collective ops are configured at startup.
    """
    kind = config.strategy
    if kind == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise DistributionError(
                "distribution.strategy multi_worker needs the TF_CONFIG environment variable (see README)"
            )
        cluster_role()  # validates TF_CONFIG
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=collective_implementation(bool(tf.config.list_physical_devices("GPU"))),
            timeout_seconds=config.collective_timeout_s,
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if kind == "auto":
        kind = "mirrored" if len(gpus) > 1 or (not gpus and config.cpu_devices > 1) else "one_device"
    if kind == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0] if gpus else cpus[0])
    devices = gpus or cpus
    if config.cpu_devices > 1 and not gpus and len(cpus) < config.cpu_devices:
        raise DistributionError(
            f"distribution.cpu_devices {config.cpu_devices} requested but only {len(cpus)} CPU devices exist"
        )
    return tf.distribute.MirroredStrategy(devices)
