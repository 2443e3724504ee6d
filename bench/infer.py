"""Inference speed: real-time factor of one-shot transcription on one core, and streaming step latency.

Models (weights do not change the speed, so they are untrained unless an
export is given): the configs/sample.yaml geometry and the configs/en.yaml one
(n_hidden 2048), exported by the real Export code to a temporary directory.
The process is pinned to one CPU and every runtime gets one thread. Audio: the
first clips of the sample test split, features included in the timing.
The SavedModel (TensorFlow) is the baseline the TFLite figures compare with.
Last line: one JSON object with rtf_sample_tflite, rtf_en_tflite (int8 dynamic
range, as configs/en.yaml exports), rtf_en_tflite_float, rtf_en_savedmodel,
stream_step_p50_ms, stream_step_p95_ms (en int8 TFLite, one n_steps call), and
the same int8 model at 20 ms frames (en.yaml with features.type deepspeech, as
DeepSpeech's and Coqui STT's models): rtf_en_20ms_tflite,
stream_step_20ms_p50_ms, stream_step_20ms_p95_ms, and that model again with a
thread on every CPU of the machine (rtf_en_20ms_tflite_all_cpus,
stream_step_20ms_all_cpus_p50_ms / _p95_ms, all_cpus_threads).

    python bench/infer.py [--clips 12] [--steps 300]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def export_untrained(config_path: Path, out: Path, quantize: bool, features: dict | None = None) -> Path:
    """Export an untrained model of ``config_path``'s geometry (``features``: other feature settings)
    with the real Export code; with ``normalize: global`` the graph normalises with the identity (mean 0,
    deviation 1: an untrained model has no training set), the same operations as a trained one's."""
    import tensorflow as tf

    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.model import build_model
    from pipeline.model.weights import named_weights
    from pipeline.stages.export import export_stage

    overrides = {
        "paths": {"work_dir": str(out / "work"), "export_dir": str(out / "exported-model")},
        "export": {"quantize": quantize},
        **({"features": features} if features else {}),
    }
    config = load_config(config_path, overrides)
    from pipeline.features.frontend import feature_pipeline

    normalized = config.features.normalize == "global"
    model = build_model(
        config.model, feature_pipeline(config.features).feature_size, 29, normalized=normalized
    )
    prefix = tf.train.Checkpoint(weights=named_weights(model)).write(str(out / "ckpt" / "untrained"))
    return export_stage(Layout(config), checkpoint=prefix).root


def rtf(model, clips: list[np.ndarray], rate: int) -> float:
    """Processing time over audio time for one-shot transcription of ``clips`` (after one warm-up)."""
    model.transcribe(clips[0])
    started = time.perf_counter()
    for samples in clips:
        model.transcribe(samples)
    return (time.perf_counter() - started) / (sum(len(c) for c in clips) / rate)


def step_latency(model, steps: int) -> tuple[float, float]:
    """p50 and p95 in ms of one streaming call (n_steps windows, state carried)."""
    metadata = model.metadata
    rng = np.random.default_rng(0)
    windows = rng.standard_normal((1, metadata.n_steps, 2 * metadata.n_context + 1, metadata.n_input)).astype(
        np.float32
    )
    state = model.runner.zero_state()
    times = []
    for i in range(steps + 5):
        started = time.perf_counter()
        _, state = model.runner.step(windows, state)
        if i >= 5:
            times.append((time.perf_counter() - started) * 1000)
    return float(np.percentile(times, 50)), float(np.percentile(times, 95))


def main(argv=None) -> int:
    """Export the models, measure, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=12, help="sample test clips to transcribe")
    parser.add_argument("--steps", type=int, default=300, help="streaming calls to time")
    args = parser.parse_args(argv)
    every_cpu = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {every_cpu[0]})

    from native_client import Model
    from native_client.audio import load_for_model
    from pipeline.workdir import ExportFiles

    rows = list(csv.DictReader(open(ROOT / "data" / "sample" / "test.csv")))[: args.clips]
    clips = [load_for_model(ROOT / "data" / "sample" / row["wav_filename"], 16000) for row in rows]
    audio_s = sum(len(c) for c in clips) / 16000
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sample = export_untrained(ROOT / "configs" / "sample.yaml", tmp / "sample", quantize=False)
        en_float = export_untrained(ROOT / "configs" / "en.yaml", tmp / "en_float", quantize=False)
        en_int8 = export_untrained(ROOT / "configs" / "en.yaml", tmp / "en_int8", quantize=True)
        en_20ms = export_untrained(
            ROOT / "configs" / "en.yaml",
            tmp / "en_20ms",
            quantize=True,
            features={"type": "deepspeech", "winlen": 0.032, "winstep": 0.02},
        )
        print(f"{len(clips)} clips, {audio_s:.1f} s of audio; one CPU, one thread", flush=True)
        runs = {
            "rtf_sample_tflite": (sample, "tflite"),
            "rtf_en_tflite": (en_int8, "tflite"),
            "rtf_en_tflite_float": (en_float, "tflite"),
            "rtf_en_savedmodel": (en_float, "saved_model"),
            "rtf_en_20ms_tflite": (en_20ms, "tflite"),
        }
        models = {}
        for key, (export, backend) in runs.items():
            models[key] = Model(export, backend=backend, threads=1)
            figures[key] = round(rtf(models[key], clips, 16000), 4)
            print(f"{key}: RTF {figures[key]}", flush=True)
        p50, p95 = step_latency(models["rtf_en_tflite"], args.steps)
        figures["stream_step_p50_ms"], figures["stream_step_p95_ms"] = round(p50, 2), round(p95, 2)
        d50, d95 = step_latency(models["rtf_en_20ms_tflite"], args.steps)
        figures["stream_step_20ms_p50_ms"], figures["stream_step_20ms_p95_ms"] = round(d50, 2), round(d95, 2)
        # The same model with a thread per CPU of the machine: at batch 1 the LSTM reads its 16.8 MB int8
        # recurrent kernel every frame, which one core's memory bandwidth bounds.
        os.sched_setaffinity(0, set(every_cpu))
        threads = len(every_cpu)
        wide = Model(en_20ms, backend="tflite", threads=threads)
        figures["rtf_en_20ms_tflite_all_cpus"] = round(rtf(wide, clips, 16000), 4)
        w50, w95 = step_latency(wide, args.steps)
        figures["stream_step_20ms_all_cpus_p50_ms"] = round(w50, 2)
        figures["stream_step_20ms_all_cpus_p95_ms"] = round(w95, 2)
        figures["all_cpus_threads"] = threads
        print(
            f"rtf_en_20ms_tflite with {threads} threads: RTF {figures['rtf_en_20ms_tflite_all_cpus']}",
            flush=True,
        )
        os.sched_setaffinity(0, {every_cpu[0]})
        f50, f95 = step_latency(models["rtf_en_tflite_float"], args.steps)
        figures["stream_step_float_p50_ms"], figures["stream_step_float_p95_ms"] = (
            round(f50, 2),
            round(f95, 2),
        )
        figures["en_tflite_speedup_vs_savedmodel"] = round(
            figures["rtf_en_savedmodel"] / figures["rtf_en_tflite"], 2
        )
        figures["en_tflite_mb"] = round(ExportFiles(en_int8).file("tflite").stat().st_size / 1e6, 1)
        figures["en_tflite_float_mb"] = round(ExportFiles(en_float).file("tflite").stat().st_size / 1e6, 1)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    raise SystemExit(main())
