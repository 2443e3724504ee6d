"""Benchmark of the Features stage against a plain single-process python_speech_features loop.

Both run in this process on the same corpus (default: the sample train
split). Prints both rates and their ratio, then what the cache's fletcher32
checksums cost: the split's features written and read back (batch-sized reads)
with and without the filter, in this process. The last line is one JSON object
with keys baseline_audio_s_per_s, stage_audio_s_per_s, ratio,
checksum_write_ratio and checksum_read_ratio (time with checksums / without).

    python bench/features.py [--config configs/sample.yaml] [--split train] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import soundfile
from python_speech_features import mfcc

from native_client.alphabet import load_alphabet
from pipeline.config_loader import load_config
from pipeline.data.manifests import read_manifests
from pipeline.features.cache import CHUNK_FRAMES
from pipeline.layout import Layout
from pipeline.stages.features import features_stage


def baseline(paths: list[str], numcep: int) -> tuple[float, float]:
    """Read and featurise every file in one process, writing nothing;
    returns (audio seconds, wall seconds)."""
    started = time.perf_counter()
    audio = 0.0
    for path in paths:
        signal, rate = soundfile.read(path, dtype="int16")
        mfcc(signal, samplerate=rate, numcep=numcep)
        audio += len(signal) / rate
    return audio, time.perf_counter() - started


def _timed_copy(features: np.ndarray, path: Path, checksums: bool, repeats: int) -> tuple[float, float]:
    """Write ``features`` as the cache does (chunks of CHUNK_FRAMES), then read it in 16-utterance-sized
    slices; best (write, read) seconds of ``repeats``."""
    writes, reads = [], []
    step = 16 * 600  # frames of a batch of 16 six-second utterances
    for _ in range(repeats):
        path.unlink(missing_ok=True)
        started = time.perf_counter()
        with h5py.File(path, "w") as h5:
            data = h5.create_dataset(
                "features",
                shape=features.shape,
                dtype=np.float32,
                chunks=(min(len(features), CHUNK_FRAMES), features.shape[1]),
                fletcher32=checksums,
            )
            for start in range(0, len(features), CHUNK_FRAMES):
                data[start : start + CHUNK_FRAMES] = features[start : start + CHUNK_FRAMES]
        writes.append(time.perf_counter() - started)
        started = time.perf_counter()
        with h5py.File(path, "r") as h5:
            for start in range(0, len(features), step):
                h5["features"][start : start + step]
        reads.append(time.perf_counter() - started)
    return min(writes), min(reads)


def checksum_cost(cache: Path, scratch: Path, repeats: int = 5) -> tuple[float, float]:
    """(write, read) time with fletcher32 over the time without, on the features of ``cache``."""
    with h5py.File(cache, "r") as h5:
        features = h5["features"][...]
    plain = _timed_copy(features, scratch / "plain.h5", False, repeats)
    checked = _timed_copy(features, scratch / "checked.h5", True, repeats)
    megabytes = features.nbytes / 2**20
    print(
        f"{megabytes:.1f} MB of features: read {megabytes / plain[1]:.0f} MB/s without checksums, "
        f"{megabytes / checked[1]:.0f} MB/s with",
        file=sys.stderr,
    )
    return checked[0] / plain[0], checked[1] / plain[1]


def main(argv=None) -> int:
    """Run both measurements and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", default=str(Path(__file__).resolve().parent.parent / "configs" / "sample.yaml")
    )
    parser.add_argument("--split", default="train")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as work:
        # Without augmented copies: the baseline reads each manifest row once.
        config = load_config(
            args.config,
            {
                "paths": {"work_dir": work},
                "features": {"workers": args.workers},
                "augment": {"speed_factors": []},
            },
        )
        samples, _ = read_manifests(
            config.split_files(args.split),
            config.split_limit(args.split),
            load_alphabet(Layout(config).alphabet),
            config.data.text,
        )
        audio, base_wall = baseline([s.audio_path for s in samples], config.features.numcep)
        started = time.perf_counter()
        summary = features_stage(Layout(config), args.split)
        stage_wall = time.perf_counter() - started
        write_ratio, read_ratio = checksum_cost(Layout(config).features_cache(args.split), Path(work))
    base_rate = audio / base_wall
    stage_rate = summary.audio_seconds / stage_wall
    print(f"{len(samples)} files, {audio / 60:.1f} min of audio", file=sys.stderr)
    print(
        f"baseline (1 process, no output): {base_rate:.0f} audio s per s ({base_wall:.2f} s)", file=sys.stderr
    )
    print(
        f"Features stage ({args.workers} workers, HDF5 written): "
        f"{stage_rate:.0f} audio s per s ({stage_wall:.2f} s)",
        file=sys.stderr,
    )
    print(
        f"fletcher32 checksums: write x{write_ratio:.3f}, batch reads x{read_ratio:.3f} the time without",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "baseline_audio_s_per_s": round(base_rate, 1),
                "stage_audio_s_per_s": round(stage_rate, 1),
                "ratio": round(stage_rate / base_rate, 3),
                "checksum_write_ratio": round(write_ratio, 3),
                "checksum_read_ratio": round(read_ratio, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    sys.exit(main())
