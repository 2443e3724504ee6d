"""The training input pipeline alone (issue 45 F11): batches read from the feature cache, padded and
handed over, no model; per number of parallel readers (tf.data's parallel calls), against 1 reader
in the same run.

On ``configs/sample.yaml``'s whole training split (its speed-perturbed copies
included; features built into a temporary work directory, so the cache is in the
page cache: this is the reader's rate, not the disk's). Each figure is the best
of 3 epochs:

- ``mb_per_s``: megabytes of cached features read per second (the utterances'
  own frames), and ``padded_mb_per_s`` what the batches hand over;
- ``utterances_per_s`` and ``audio_s_per_s`` (seconds of audio per second);
- ``ratio``: audio seconds per second against 1 reader.

Beside them, the rate a GPU run needs on paper: the issue's anchor (DeepSpeech's
geometry in PyTorch with cuDNN's LSTM trained 4,183 audio s/s in TF32 and 8,933
in bf16 on one H100; not measured here) times 1 and 8 GPUs, in this front end's
bytes per audio second and in those of an 80-band 10 ms front end (a Conformer's).

The last line is one JSON object with every figure.

    python bench/input.py [--readers 1 2 4] [--bucket-growth 1.1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.batches.buckets import shape_grid
from pipeline.batches.dataset import SplitReader, batch_plan, train_dataset
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.stages.features import features_stage
from pipeline.stages.outputs import split_cache

ROOT = Path(__file__).resolve().parent.parent
ANCHORS = {"h100_tf32": 4183.0, "h100_bf16": 8933.0}  # audio s/s of one H100 (the figures)
CONFORMER_BYTES_PER_AUDIO_S = 100 * 80 * 4  # 80 float32 bands every 10 ms


def reader_rate(index, batch: int, readers: int, growth: float, epochs: int = 3) -> dict:
    """The best epoch's rates of the input pipeline with ``readers`` parallel readers."""
    grid = shape_grid(index, growth)
    reader = SplitReader(index, grid, readers)
    plan = batch_plan(index.lengths, batch, 1, grid=grid)
    real_bytes = float(index.lengths.sum()) * index.n_input * 4
    best, padded = float("inf"), 0
    for epoch in range(epochs):
        dataset = train_dataset(reader, plan, 1, 0, 1, epoch, 0, epoch + 1, 1234)
        started, padded = time.perf_counter(), 0
        for features, *_ in dataset:
            padded += features.numpy().nbytes
        best = min(best, time.perf_counter() - started)
    reader.reader.close()
    utterances = sum(len(b) for b in plan)
    return {
        "readers": readers,
        "mb_per_s": round(real_bytes / best / 1e6, 1),
        "padded_mb_per_s": round(padded / best / 1e6, 1),
        "utterances_per_s": round(utterances / best, 1),
        "audio_s_per_s": round(float(index.durations.sum()) / best, 1),
    }


def sample_split(work: Path):
    """(config, cached index) of ``configs/sample.yaml``'s whole training split (its speed copies
    included), built in work directory ``work`` unless it is there already."""
    layout = Layout(load_config(ROOT / "configs" / "sample.yaml", {"paths": {"work_dir": str(work)}}))
    if not layout.features_cache("train").exists():
        features_stage(layout, "train")
    return layout.config, split_cache(layout, "train")


def needed(bytes_per_audio_s: float) -> dict:
    """MB/s of features each anchor rate needs on 1 and 8 GPUs at ``bytes_per_audio_s``."""
    return {
        f"{name}_x{gpus}": round(rate * gpus * bytes_per_audio_s / 1e6, 1)
        for name, rate in ANCHORS.items()
        for gpus in (1, 8)
    }


def main(argv=None) -> int:
    """Measure each reader count, print a table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--bucket-growth", type=float, default=0.0, help="training.bucket_growth (0: off)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        config, index = sample_split(Path(work))
        frames_per_audio_s = float(index.lengths.sum()) / float(index.durations.sum())
        bytes_per_audio_s = frames_per_audio_s * index.n_input * 4
        rates = [reader_rate(index, config.training.batch_size, n, args.bucket_growth) for n in args.readers]
    base = rates[0]["audio_s_per_s"]
    for rate in rates:
        rate["ratio"] = round(rate["audio_s_per_s"] / base, 2)
    print(
        f"{len(index)} utterances, {float(index.durations.sum()) / 3600:.2f} h, "
        f"{index.n_input} inputs x {frames_per_audio_s:.0f} frames a second = "
        f"{bytes_per_audio_s / 1e3:.1f} kB per audio second"
    )
    print("| readers | MB/s read | MB/s padded | utterances/s | audio s/s | vs 1 reader |")
    print("|---|---|---|---|---|---|")
    for r in rates:
        print(
            f"| {r['readers']} | {r['mb_per_s']} | {r['padded_mb_per_s']} | {r['utterances_per_s']} "
            f"| {r['audio_s_per_s']} | {r['ratio']}x |"
        )
    figures = {
        "utterances": len(index),
        "audio_hours": round(float(index.durations.sum()) / 3600, 3),
        "bytes_per_audio_s": round(bytes_per_audio_s, 1),
        "bucket_growth": args.bucket_growth,
        "rates": rates,
        "needed_mb_per_s_this_front_end": needed(bytes_per_audio_s),
        "needed_mb_per_s_80_band_10ms": needed(CONFORMER_BYTES_PER_AUDIO_S),
        "input_mb_per_s": next((r["mb_per_s"] for r in rates if r["readers"] == 2), rates[-1]["mb_per_s"]),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    np.seterr(all="ignore")
    sys.exit(main())
