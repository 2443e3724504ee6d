"""How long deleting a distributed iterator over two towers takes after it has run a while, with the
batch pipelines' options (``pipeline.batches.dataset.input_options``: tf.data's autotuning off) against
tf.data's defaults (autotuning on), in the same run.

With autotuning on, the iterator's model thread sleeps between optimisations for a period that doubles up
to a minute, and a MultiDeviceIterator's destructor waits for it: a Trainer with towers, freed by the
garbage collector, stalled whatever ran next for up to a minute per iterator. Prints the CPU line, one line
per setting and a JSON object last.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np
import tensorflow as tf

from pipeline.batches.dataset import input_options


def teardown_seconds(strategy, options: tf.data.Options | None, run_s: float) -> float:
    """Seconds to delete (and collect) an iterator of two towers that ran ``run_s`` seconds."""

    def numbers():
        count = 0
        while True:
            yield np.full([4], count, np.float32)
            count += 1

    def dataset_fn(_):
        data = tf.data.Dataset.from_generator(numbers, output_signature=tf.TensorSpec([4], tf.float32))
        data = data.map(lambda x: x * 2, num_parallel_calls=2).batch(2).prefetch(2)
        return data if options is None else data.with_options(options)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    started = time.monotonic()
    while time.monotonic() - started < run_s:
        next(iterator)
        time.sleep(0.01)
    started = time.monotonic()
    del iterator
    gc.collect()
    return time.monotonic() - started


def main() -> None:
    """Run both settings on two logical CPU devices and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-s", type=float, default=90.0, help="seconds each iterator runs first")
    args = parser.parse_args()
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ours = teardown_seconds(strategy, input_options(), args.run_s)
    print(f"input_options (autotune off): deleting the iterator took {ours:.2f} s", flush=True)
    defaults = teardown_seconds(strategy, None, args.run_s)
    print(f"tf.data defaults (autotune on): deleting the iterator took {defaults:.2f} s", flush=True)
    print(json.dumps({"run_s": args.run_s, "teardown_s": ours, "teardown_s_defaults": defaults}))


if __name__ == "__main__":
    main()
