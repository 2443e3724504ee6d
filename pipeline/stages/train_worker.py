"""One multi-worker training process: ``python -P -m pipeline.stages.train_worker --config X`` with
``TF_CONFIG`` set.

Started by ``pipeline.train.multiworker.launch_local_workers`` (one machine) or by
hand / a cluster manager on each machine. Prints, as its last stdout line, one
JSON object with this worker's index, final global step and a digest of its
weights, so that a caller can check that every worker ended with the same model.
Exit status 3 and a one-line error when another worker was lost. The Train task
that starts it adds ``--init-digest D`` with ``training.init_from``: the digest its
run's fingerprint holds, which the worker's fingerprint and warm start then use.

An error no retry mends (a config error, a changed ``training.init_from``, a non-finite
stop) is its one line and exit status ``FINAL`` (5), which the launcher raises as final.

SIGTERM, SIGINT, SIGHUP or its launcher's ``SIGUSR2`` (``pipeline.train.stop_signals``)
ask for a stop: every worker stops after the same step, with a checkpoint of it; the
line then has ``stopped`` (the reason) instead of the digest, and the exit status is
``STOPPED`` (4).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from native_client.plugins import PluginError
from pipeline.config import ConfigError
from pipeline.config_loader import load_config
from pipeline.model.checkpoints import CheckpointMismatchError
from pipeline.train.bind_address import bound_environment, is_bound
from pipeline.train.checkpointing import TrainingError
from pipeline.train.distribute import DistributionError, cluster_role
from pipeline.train.hooks import StepInfo, StopTraining, TrainHooks
from pipeline.train.multiworker import FINAL, worker_command, worker_environment
from pipeline.train.stop_signals import STOPPED, SignalStop, stop_on_signals

# Errors the same run meets again on a retry (``tasks.retries.final_errors``, as far as a worker meets them).
FINAL_ERRORS = (ConfigError, PluginError, TrainingError, CheckpointMismatchError)


def main(argv=None) -> int:
    """Train as the worker that ``TF_CONFIG`` names."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.train_worker")
    parser.add_argument("--config", required=True)
    # The digest of training.init_from the scheduled run's Train fingerprint holds (train_launch gives it).
    parser.add_argument("--init-digest")
    args = parser.parse_args(argv)
    if sys.platform.startswith("linux") and os.environ.get("TF_CONFIG") and not is_bound():
        # Start again with the library that keeps TensorFlow's server on this worker's own address.
        try:
            env = bound_environment(os.environ["TF_CONFIG"])
        except (DistributionError, ValueError, KeyError, IndexError) as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            return 3
        os.execve(sys.executable, worker_command(*sys.argv[1:]), worker_environment(env))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(process)d %(levelname)s %(message)s")
    stop = SignalStop()
    with stop_on_signals(stop):
        return _train(args.config, args.init_digest, stop)


def _train(config_path: str, init_digest: str | None, stop: SignalStop) -> int:
    """Train, stopping at the end of a step when ``stop`` is requested; returns the exit status."""
    from pipeline.layout import Layout
    from pipeline.stages.train import train_stage

    last_step = -1

    def on_step(info: StepInfo) -> None:
        nonlocal last_step
        last_step = info.step
        stop.check(info)

    try:
        config = load_config(config_path)
        if config.distribution.strategy != "multi_worker":
            raise DistributionError(
                f"{config_path}: a cluster worker needs distribution.strategy: multi_worker "
                f"(it is {config.distribution.strategy})"
            )
        stop.accumulate = config.training.accumulate_batches
        report = train_stage(Layout(config, init_from_digest=init_digest), hooks=TrainHooks(on_step=on_step))
    except DistributionError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 3
    except FINAL_ERRORS as error:  # the launcher makes it a final error: retrying it would fail again
        print(f"error: {error}", file=sys.stderr, flush=True)
        return FINAL
    except StopTraining as request:  # every worker stopped after this step, with its checkpoint
        print(f"stopped: {request}", file=sys.stderr, flush=True)
        print(
            json.dumps({"worker": cluster_role().index, "global_step": last_step, "stopped": str(request)}),
            flush=True,
        )
        return STOPPED
    print(
        json.dumps(
            {
                "worker": cluster_role().index,
                "global_step": report.global_step,
                "weights_sha256": report.weights_sha256,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
