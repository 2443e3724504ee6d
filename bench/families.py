"""The model families side by side: DeepSpeech (configs/sample.yaml), the Conformer
(configs/sample-conformer.yaml) and the Conformer-Transducer (configs/sample-transducer.yaml) trained on
the embedded sample corpus on this CPU, one after the other in one run, then the full-size int8 exports'
(configs/en.yaml, configs/en-conformer.yaml, configs/en-transducer.yaml; untrained: weights do not change
the speed) one-shot real-time factor on one core with one thread.

Per family: training audio seconds per wall second (the train split's audio, speed copies included, times
the epochs, over the Train stage's wall time), wall time to the best dev CER (the Train wall time up to the
epoch of the best validation, epochs taking equal time), the Train and whole-DAG wall time (Evaluate:
features, LM, train, evaluation), test CER/WER greedy and with the beam search and the LM; for the
Conformer, whose export runs chunks of ``chunk_frames`` labels, the greedy test CER/WER of its full-context
computation beside (``*_full_context``) and the chunked CER's gap to it.

The streaming figures (``streaming``) of the Conformer-CTC and the Conformer-Transducer at their en
configs' size (int8 TFLite, untrained, one core, one thread, ``features.normalize: false``: no
normalisation in the graph) for ``chunk_frames`` 8 and 16: one encoder call's p50 and p95 (a chunk with
its look-back frames and the caches, state carried), the RTF of streaming the sample clips through the
client (features included, 0.1 s blocks, greedy decoding: for the transducer its greedy search over the
predictor and joiner; ``beam_stream_rtf``: its modified beam search, beam 4), the algorithmic latency
(the chunk plus the look-ahead, in ms of audio), and the transducer's stream RTF over the CTC one's
(``transducer_over_ctc``; the issue's goal: at most 1.3). First line: the CPU; last line: one JSON object.

    python bench/families.py                   # the full run (three sample trainings: about 40 minutes)
    python bench/families.py --quick           # a smoke run: 64 training utterances, 2 epochs, 2 clips
    python bench/families.py --streaming-only  # the full-size figures only, no training (minutes)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = {
    "deepspeech": ROOT / "configs" / "sample.yaml",
    "conformer": ROOT / "configs" / "sample-conformer.yaml",
    "transducer": ROOT / "configs" / "sample-transducer.yaml",
}
FULL_SIZE = {
    "deepspeech": ROOT / "configs" / "en.yaml",
    "conformer": ROOT / "configs" / "en-conformer.yaml",
    "transducer": ROOT / "configs" / "en-transducer.yaml",
}
STREAMING = ("conformer", "transducer")  # the families whose streaming figures are measured
CHUNKS = (8, 16)  # the conformer's chunk_frames the streaming figures are measured at
BLOCK = 1600  # samples fed to a stream at a time: 0.1 s at 16 kHz


def train_and_evaluate(name: str, config: Path, work: Path, quick: bool) -> dict:
    """Run the DAG up to Evaluate for ``config`` in ``work`` (a fresh work directory); its figures."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.reports import EvaluationReport, TrainReport, read_report

    overrides = f"extends: {config}\npaths:\n  work_dir: {work / 'work'}\n"
    if quick:
        overrides += "data:\n  limit_train: 64\n  limit_dev: 16\n  limit_test: 16\ntraining:\n  epochs: 2\n"
    path = work / f"{name}.yaml"
    path.write_text(overrides)
    started = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "Evaluate", "--config", str(path), "--local-scheduler"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    dag_s = time.perf_counter() - started
    if run.returncode:
        raise SystemExit(
            f"{name}: Evaluate failed (exit {run.returncode}): {run.stderr.strip().splitlines()[-1:]}"
        )
    layout = Layout(load_config(path))
    train = read_report(layout.train_run.report, TrainReport)
    evaluation = read_report(layout.evaluation_report(layout.evaluate_dir), EvaluationReport)
    best = min(train.validations, key=lambda v: v["cer"] if isinstance(v, dict) else v.cer)
    best_epoch = best["epoch"] if isinstance(best, dict) else best.epoch
    epochs = max(1, train.epochs_completed)
    return {
        "train_audio_s_per_s": round(train.train_audio_hours * 3600 * epochs / train.wall_time_s, 1),
        "train_wall_s": round(train.wall_time_s, 1),
        "wall_to_best_dev_cer_s": round(train.wall_time_s * best_epoch / epochs, 1),
        "best_dev_cer": round(best["cer"] if isinstance(best, dict) else best.cer, 4),
        "dag_wall_s": round(dag_s, 1),
        "test_cer_greedy": round(evaluation.cer, 4),
        "test_wer_greedy": round(evaluation.wer, 4),
        "test_cer_lm": None if evaluation.cer_lm is None else round(evaluation.cer_lm, 4),
        "test_wer_lm": None if evaluation.wer_lm is None else round(evaluation.wer_lm, 4),
        "test_utterances": evaluation.samples_count,
        **_full_context(evaluation),
    }


def _full_context(evaluation) -> dict:
    """The full-context greedy figures of a family whose export runs chunks, and the relative gap of the
    chunked CER to them (the issue's goal: within 10%); nothing for the others."""
    if evaluation.cer_full_context is None:
        return {}
    gap = evaluation.cer / evaluation.cer_full_context - 1 if evaluation.cer_full_context else None
    return {
        "test_cer_full_context": round(evaluation.cer_full_context, 4),
        "test_wer_full_context": round(evaluation.wer_full_context, 4),
        "chunked_cer_gap": None if gap is None else round(gap, 4),
    }


def one_shot_rtf(config: Path, work: Path, clips: int) -> float:
    """RTF of one-shot transcription on one core, one thread, of the int8 export of ``config``'s geometry
    (untrained), over the first ``clips`` sample test clips."""
    from infer import export_untrained, rtf  # bench/, the folder of the script

    from native_client import Model
    from native_client.audio import load_for_model

    rows = list(csv.DictReader(open(ROOT / "data" / "sample" / "test.csv")))[:clips]
    audio = [load_for_model(ROOT / "data" / "sample" / row["wav_filename"], 16000) for row in rows]
    export = export_untrained(config, work, quantize=True)
    return rtf(Model(export, backend="tflite", threads=1), audio, 16000)


def stream_figures(config: Path, work: Path, chunk_frames: int, clips: int, calls: int) -> dict:
    """Streaming figures of the int8 export of ``config``'s geometry (untrained) at ``chunk_frames``: one
    call's p50/p95 in ms over ``calls`` calls, the RTF of streaming the first ``clips`` sample test clips
    in 0.1 s blocks, the algorithmic latency in ms. The caller pins the process to one core."""
    import numpy as np
    from infer import export_untrained  # bench/, the folder of the script

    from native_client import Model
    from native_client.audio import load_for_model
    from native_client.stream import Stream

    work.mkdir(parents=True)
    override = work / "streaming.yaml"
    override.write_text(
        f"extends: {config}\nfeatures:\n  normalize: false\nmodel:\n  conformer:\n"
        f"    chunk_frames: {chunk_frames}\n"
    )
    model = Model(export_untrained(override, work, quantize=True), backend="tflite", threads=1)
    metadata, streaming = model.metadata, model.metadata.streaming
    width = streaming.width
    inputs = np.random.default_rng(0).standard_normal((1, width, metadata.n_input)).astype(np.float32)
    state, times = model.runner.zero_state(), []
    for index in range(calls + 5):
        started = time.perf_counter()
        _, state = model.runner.step(inputs, state)
        if index >= 5:  # warm-up calls left out
            times.append((time.perf_counter() - started) * 1000)
    rows = list(csv.DictReader(open(ROOT / "data" / "sample" / "test.csv")))[:clips]
    audio = [load_for_model(ROOT / "data" / "sample" / row["wav_filename"], 16000) for row in rows]
    seconds = sum(len(a) for a in audio) / 16000

    def stream_rtf(decoder) -> float:
        started = time.perf_counter()
        for samples in audio:
            stream = Stream(model.runner, decoder)
            for start in range(0, len(samples), BLOCK):
                stream.feed_audio(samples[start : start + BLOCK])
            stream.finish()
        return round((time.perf_counter() - started) / seconds, 4)

    frame_ms = metadata.features.seconds_per_frame * 1000
    return {
        "chunk_frames": chunk_frames,
        "call_p50_ms": round(float(np.percentile(times, 50)), 2),
        "call_p95_ms": round(float(np.percentile(times, 95)), 2),
        "stream_rtf": stream_rtf(model.greedy),
        **({"beam_stream_rtf": stream_rtf(model.beam_search)} if model.beam_search else {}),
        "algorithmic_latency_ms": round((streaming.chunk + streaming.lookahead) * frame_ms),
    }


def main(argv=None) -> int:
    """Train the families, time the full-size exports, print the table and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a slice of the sample, 2 epochs")
    parser.add_argument(
        "--streaming-only", action="store_true", help="the full-size figures only: no training"
    )
    parser.add_argument("--clips", type=int, default=12, help="sample test clips for the RTF")
    parser.add_argument("--calls", type=int, default=300, help="streaming calls timed per chunk size")
    args = parser.parse_args(argv)
    clips = 2 if args.quick else args.clips
    figures: dict[str, dict] = {name: {} for name in FAMILIES}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, config in FAMILIES.items() if not args.streaming_only else ():
            (tmp / name).mkdir()
            figures[name] = train_and_evaluate(name, config, tmp / name, args.quick)
            print(f"{name}: {figures[name]}", flush=True)
        every_cpu = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {every_cpu[0]})
        for name, config in FULL_SIZE.items():
            figures[name]["en_int8_one_shot_rtf_1core"] = round(
                one_shot_rtf(config, tmp / f"{name}-en", clips), 4
            )
        streaming = {
            name: [
                stream_figures(
                    FULL_SIZE[name],
                    tmp / f"{name}-stream-{chunk}",
                    chunk,
                    clips,
                    20 if args.quick else args.calls,
                )
                for chunk in CHUNKS
            ]
            for name in STREAMING
        }
        os.sched_setaffinity(0, set(every_cpu))
    for ctc, transducer in zip(streaming["conformer"], streaming["transducer"], strict=True):
        transducer["transducer_over_ctc"] = round(transducer["stream_rtf"] / ctc["stream_rtf"], 3)
    keys = list(dict.fromkeys(key for name in figures for key in figures[name]))
    print(f"{'':28}" + "".join(f"{name:>14}" for name in figures))
    for key in keys:
        print(f"{key:28}" + "".join(f"{str(figures[name].get(key, '-')):>14}" for name in figures))
    for name in STREAMING:
        print(f"{name} streaming ({FULL_SIZE[name].name}'s size, int8 TFLite, one core, one thread):")
        for row in streaming[name]:
            print("  " + ", ".join(f"{key} {value}" for key, value in row.items()))
    print(json.dumps({"quick": args.quick, **figures, "streaming": streaming}))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    raise SystemExit(main())
