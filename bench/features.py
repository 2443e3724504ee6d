"""Benchmark of the Features stage against a plain single-process python_speech_features loop.

Both run in this process on the same corpus (default: the sample train
split). Prints both rates and their ratio; the last line is one JSON object
with keys baseline_audio_s_per_s, stage_audio_s_per_s, ratio.

    python bench/features.py [--config configs/sample.yaml] [--split train] [--workers 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import soundfile
from python_speech_features import mfcc

from native_client.alphabet import load_alphabet
from pipeline.config_loader import load_config
from pipeline.corpus import read_manifests
from pipeline.layout import Layout
from pipeline.featurize import build_split_cache


def baseline(paths: list[str], numcep: int) -> tuple[float, float]:
    """Read and featurise every file in one process, writing nothing; returns (audio seconds, wall seconds)."""
    started = time.perf_counter()
    audio = 0.0
    for path in paths:
        signal, rate = soundfile.read(path, dtype="int16")
        mfcc(signal, samplerate=rate, numcep=numcep)
        audio += len(signal) / rate
    return audio, time.perf_counter() - started


def main(argv=None) -> int:
    """Run both measurements and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "configs" / "sample.yaml"))
    parser.add_argument("--split", default="train")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as work:
        config = load_config(args.config, {"paths": {"work_dir": work}, "features": {"workers": args.workers}})
        samples, _ = read_manifests(config.split_files(args.split), config.split_limit(args.split),
                                    load_alphabet(Layout(config).alphabet))
        audio, base_wall = baseline([s.audio_path for s in samples], config.features.numcep)
        started = time.perf_counter()
        summary = build_split_cache(Layout(config), args.split)
        stage_wall = time.perf_counter() - started
    base_rate = audio / base_wall
    stage_rate = summary.audio_seconds / stage_wall
    print(f"{len(samples)} files, {audio / 60:.1f} min of audio", file=sys.stderr)
    print(f"baseline (1 process, no output): {base_rate:.0f} audio s per s ({base_wall:.2f} s)", file=sys.stderr)
    print(f"Features stage ({args.workers} workers, HDF5 written): {stage_rate:.0f} audio s per s ({stage_wall:.2f} s)",
          file=sys.stderr)
    print(json.dumps({"baseline_audio_s_per_s": round(base_rate, 1), "stage_audio_s_per_s": round(stage_rate, 1),
                      "ratio": round(stage_rate / base_rate, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
