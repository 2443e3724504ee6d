"""Scale benchmark: peak memory and speed of Features, Train and Evaluate on corpora of about \
2, 8 and 32 hours.

    .venv/bin/python bench/scale.py [--hours 2 8 32] [--cache-dir DIR] [--train-steps 60]

The corpora are made once into ``--cache-dir`` (default
``~/.cache/luigi-deepspeech-bench``, outside the repository) and reused: each
utterance joins five clips of the sample train split, about 12 s in all (the
LibriSpeech mean is 12.3 s), with speed perturbation (tempo and pitch
together, factor 0.9-1.1), gain (0.5-1.4) and white noise (SNR 15-40 dB), so
no two are alike; the smaller corpora are prefixes of the largest. Each stage
runs in its own child process and its peak RSS is that child's ``ru_maxrss``
(which covers the processes it started and waited for): FeaturesSplit (2
workers), a fixed number of Train steps (a small model, batch 8), and one
Evaluate over the whole corpus (greedy, then beam 8 with the sample LM, in
``decoder.workers`` processes). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from measured_child import run_measured

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample"
RATE = 16000
CLIPS_PER_UTTERANCE = 5


# -- the corpus ----------------------------------------------------------------------------------
def _perturbed(index: int, clips: list[tuple[np.ndarray, str]]) -> tuple[np.ndarray, str]:
    """Utterance ``index``: five clips joined, sped up or down, scaled, with noise (seeded by ``index``)."""
    from scipy.signal import resample_poly

    rng = np.random.default_rng(index)
    chosen = [clips[i] for i in rng.choice(len(clips), CLIPS_PER_UTTERANCE, replace=False)]
    signal = np.concatenate([samples for samples, _ in chosen]).astype(np.float64)
    factor = int(round(100 * rng.uniform(0.9, 1.1)))
    signal = resample_poly(signal, 100, factor)  # factor > 100: faster and higher
    signal *= rng.uniform(0.5, 1.4)
    power = np.mean(signal**2) + 1e-9
    signal += rng.normal(0.0, np.sqrt(power / 10 ** (rng.uniform(15, 40) / 10)), len(signal))
    return np.clip(np.round(signal), -32768, 32767).astype(np.int16), " ".join(text for _, text in chosen)


def _write_range(folder: Path, start: int, stop: int) -> list[tuple[str, int, str, float]]:
    import soundfile

    rows = list(csv.DictReader(open(SAMPLE / "train.csv", encoding="utf-8")))
    clips = [
        (soundfile.read(str(SAMPLE / r["wav_filename"]), dtype="int16")[0], r["transcript"]) for r in rows
    ]
    out = []
    for index in range(start, stop):
        path = folder / f"{index:06d}.wav"
        samples, text = _perturbed(index, clips)
        if not path.exists():
            tmp = path.with_name(f".{path.name}.tmp")
            soundfile.write(str(tmp), samples, RATE, subtype="PCM_16", format="WAV")
            os.replace(tmp, path)
        out.append((path.name, path.stat().st_size, text, len(samples) / RATE))
    return out


def make_corpus(cache_dir: Path, hours: list[float]) -> dict[float, Path]:
    """Manifests of about ``hours`` each (prefixes of one corpus made once in ``cache_dir``)."""
    from concurrent.futures import ProcessPoolExecutor

    folder = cache_dir / "scale-corpus"
    folder.mkdir(parents=True, exist_ok=True)
    needed = int(max(hours) * 3600 / 12.0 * 1.05) + 1
    index_file = folder / "index.json"
    rows = json.loads(index_file.read_text()) if index_file.exists() else []
    if len(rows) < needed:
        started = time.perf_counter()
        bounds = np.linspace(len(rows), needed, 9).astype(int)
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            for part in pool.map(_write_range, [folder] * 8, bounds[:-1], bounds[1:]):
                rows.extend(part)
        index_file.write_text(json.dumps(rows))
        print(f"made {len(rows)} utterances in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    manifests, total, cut = {}, 0.0, 0
    for size in sorted(hours):
        while cut < len(rows) and total < size * 3600:
            total += rows[cut][3]
            cut += 1
        manifest = folder / f"{size:g}h.csv"
        with open(manifest, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["wav_filename", "wav_filesize", "transcript"])
            writer.writerows((name, filesize, text) for name, filesize, text, _ in rows[:cut])
        manifests[size] = manifest
    return manifests


# -- the stages, each run in a child process -----------------------------------------------------
def _config(manifest: Path, work: Path):
    from pipeline.config_loader import load_config

    return load_config(
        ROOT / "configs" / "sample.yaml",
        {
            "paths": {"work_dir": str(work)},
            "data": {"train_files": [str(manifest)], "dev_files": [], "test_files": [str(manifest)]},
            "features": {"workers": 2},
            "model": {"n_hidden": 128},
            "training": {
                "batch_size": 8,
                "dev_batch_size": 16,
                "validation_epochs": 0,
                "checkpoint_secs": 100000,
            },
            "decoder": {"lm_include_train": False, "beam_width": 8, "workers": 2},
            "augment": {"speed_factors": []},
        },
    )  # measure the corpus as given, without augmented copies


def stage_features(manifest: Path, work: Path, steps: int) -> dict:
    """FeaturesSplit of the whole corpus."""
    from pipeline.layout import Layout
    from pipeline.stages.features import features_stage

    started = time.perf_counter()
    summary = features_stage(Layout(_config(manifest, work)), "train")
    return {"audio_s": summary.audio_seconds, "seconds": time.perf_counter() - started, "kept": summary.kept}


class _Enough(Exception):
    pass


def stage_train(manifest: Path, work: Path, steps: int) -> dict:
    """``steps`` training steps from the on-disk reader; audio seconds per second over all but the first 5."""
    import tensorflow as tf

    from native_client.alphabet import load_alphabet
    from pipeline.batches.dataset import epoch_batches
    from pipeline.layout import Layout
    from pipeline.model.weights import named_weights
    from pipeline.stages.outputs import split_cache
    from pipeline.train.distribute import make_strategy
    from pipeline.train.hooks import StepInfo, TrainHooks
    from pipeline.train.loop import Trainer
    from pipeline.train.tasks import TaskData

    config = _config(manifest, work)
    layout = Layout(config)
    data = split_cache(layout, "train")
    marks: list[float] = []

    def on_step(info: StepInfo) -> None:
        marks.append(time.perf_counter())
        if len(marks) == steps:
            raise _Enough

    trainer = Trainer(
        config,
        work / "run",
        [TaskData.only(data, None, load_alphabet(layout.alphabet))],
        make_strategy(config.distribution),
        hooks=TrainHooks(on_step=on_step),
    )
    try:
        trainer.fit()
    except _Enough:
        pass
    seen, epoch = [], 0  # the batches of the steps taken, across epochs on a small corpus
    while len(seen) < steps:
        seen.extend(epoch_batches(trainer.inputs.plans[0], epoch, config.training.shuffle_seed))
        epoch += 1
    audio = float(sum(data.durations[b].sum() for b in seen[5:steps]))
    tf.train.Checkpoint(weights=named_weights(trainer.model)).write(str(work / "weights" / "ckpt"))
    return {"audio_s": audio, "seconds": marks[-1] - marks[4], "steps": steps}


def stage_evaluate(manifest: Path, work: Path, steps: int) -> dict:
    """Evaluate over the whole corpus: greedy, and beam + LM in ``decoder.workers`` processes."""
    from pipeline.layout import Layout
    from pipeline.stages.evaluate import evaluate_stage
    from pipeline.stages.language_model import language_model_stage

    layout = Layout(_config(manifest, work))
    test = layout.features_cache("test")
    if not test.exists():  # the same manifest as train: reuse its cache instead of extracting it again
        os.symlink(layout.features_cache("train"), test)
    language_model_stage(layout)
    started = time.perf_counter()
    report = evaluate_stage(layout, checkpoint=work / "weights" / "ckpt", beam=True)
    seconds = time.perf_counter() - started
    from pipeline.features.cache import cache_summary

    return {
        "audio_s": cache_summary(test)["audio_seconds"],
        "seconds": seconds,
        "samples": report.samples_count,
        "decode_lm_s": report.decode_lm_s,
    }


STAGES = {"features": stage_features, "train": stage_train, "evaluate": stage_evaluate}


def run_child(stage: str, manifest: Path, work: Path, steps: int) -> tuple[dict, float]:
    """Run one stage in a child process; (its result, its peak RSS in MiB)."""
    return run_measured(
        [
            __file__,
            "--child",
            stage,
            "--manifest",
            str(manifest),
            "--work",
            str(work),
            "--train-steps",
            str(steps),
        ],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        return ", ".join(
            f"{k.strip()} {fields[k].strip()}" for k in ("Model name", "L2 cache", "L3 cache") if k in fields
        )
    except OSError:
        return platform.processor()


def main(argv=None) -> int:
    """Make (or reuse) the corpora, run each stage per size, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, nargs="+", default=[2, 8, 32])
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "luigi-deepspeech-bench")
    # 60: enough batches to average out their lengths, and all inside epoch 0 of the 2 h corpus (73
    # batches), so no size pays for an epoch-end checkpoint inside the measured window.
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--child", choices=sorted(STAGES), help=argparse.SUPPRESS)
    parser.add_argument("--manifest", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(STAGES[args.child](args.manifest, args.work, args.train_steps)), flush=True)
        return 0

    manifests = make_corpus(args.cache_dir, args.hours)
    figures: dict[str, list] = {
        key: []
        for key in (
            "hours",
            "features_peak_rss_mb",
            "train_peak_rss_mb",
            "evaluate_peak_rss_mb",
            "features_audio_s_per_s",
            "train_audio_s_per_s",
            "evaluate_audio_s_per_s",
        )
    }
    for size in sorted(args.hours):
        work = Path(tempfile.mkdtemp(prefix=f"scale-{size:g}h-", dir=args.cache_dir))
        try:
            for stage in ("features", "train", "evaluate"):
                result, rss = run_child(stage, manifests[size], work, args.train_steps)
                figures[f"{stage}_peak_rss_mb"].append(round(rss, 1))
                figures[f"{stage}_audio_s_per_s"].append(round(result["audio_s"] / result["seconds"], 1))
                if stage == "features":
                    figures["hours"].append(round(result["audio_s"] / 3600, 2))
                print(
                    f"{size:g} h: {stage}: peak RSS {rss:.0f} MiB, "
                    f"{result['audio_s'] / result['seconds']:.1f} audio s/s ({result})",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    hours = np.array(figures["hours"])
    for stage in ("features", "train", "evaluate"):
        rss = np.array(figures[f"{stage}_peak_rss_mb"])
        slope, intercept = np.polyfit(hours, rss, 1) if len(hours) > 1 else (0.0, rss[0])
        figures[f"{stage}_rss_fit_mb"] = {
            "at_0h": round(float(intercept), 1),
            "per_hour": round(float(slope), 2),
            "at_960h": round(float(intercept + 960 * slope), 1),
            "at_5000h": round(float(intercept + 5000 * slope), 1),
        }
        figures[f"{stage}_rss_ratio_largest_vs_smallest"] = round(float(rss[-1] / rss[0]), 3)
    figures["train_speed_ratio_largest_vs_smallest"] = round(
        figures["train_audio_s_per_s"][-1] / figures["train_audio_s_per_s"][0], 3
    )
    figures["cpu"] = _cpu()
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    sys.exit(main())
