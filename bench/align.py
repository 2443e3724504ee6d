"""Align and Clean benchmark: hours of audio aligned per wall-clock hour on one core, the peak memory of
aligning a 10-minute and a 2-hour recording (flat: the ratio), and Clean's utterances per second.

    .venv/bin/python bench/align.py [--model EXPORT] [--minutes 10 120] [--cache-dir DIR]

The model (aligner and scorer) is ``--model``, default the export of ``configs/sample.yaml`` (``make
train`` builds it). The recordings are made once into ``--cache-dir`` (default
``~/.cache/luigi-deepspeech-bench/align``) by ``data/generate_recordings.py``: the sample's language-model
sentences spoken by espeak-ng with pauses, their text beside them (needs espeak-ng and sox). Each size is
aligned in its own child process, on one thread, through ``pipeline.data.align_recording`` (the Align
stage's work for one recording: posteriors streamed to disk, windowed CTC segmentation); its peak RSS is
the child's. Clean scores the sample's dev and test clips (``pipeline.data.clean.score_row``) in another
child. Prints the CPU line first; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from measured_child import run_measured

ROOT = Path(__file__).resolve().parent.parent


def make_recording(folder: Path, minutes: int) -> Path:
    """A recording of about ``minutes`` minutes and its text in ``folder`` (made once)."""
    from data.generate_recordings import make_recording as speak_recording
    from data.generate_recordings import prose

    audio = folder / f"recording-{minutes}min.flac"
    if audio.exists() and audio.with_suffix(".txt").exists():
        return audio
    lines = (ROOT / "data/sample/lm_corpus.txt").read_text(encoding="utf-8").splitlines()
    lines = [line for line in lines if 4 <= len(line.split()) <= 14]
    sentences = random.Random(minutes).sample(lines, int(minutes * 60 / 3.2))  # about 3.2 s a sentence
    folder.mkdir(parents=True, exist_ok=True)
    speak_recording(audio, sentences, seed=minutes)
    audio.with_suffix(".txt").write_text(prose(sentences, per_line=3), encoding="utf-8")
    return audio


def align_child(model: str, audio: str) -> dict:
    """In the child: align one recording on one thread; seconds of audio, wall seconds, utterances."""
    from native_client.audio import probe
    from pipeline.data.align_recording import align_recording
    from pipeline.data.aligner import Aligner
    from pipeline.data.importers import Utterance
    from pipeline.data.importers.recordings import AlignOptions
    from pipeline.data.text import TextSettings

    aligner = Aligner(model, threads=1)
    text = Path(audio).with_suffix(".txt").read_text(encoding="utf-8")
    row = Utterance(audio, text, "reader", f"{Path(audio).with_suffix('.txt')}:1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        result = align_recording(
            row, audio, probe(audio), TextSettings(), AlignOptions(model=model), aligner, Path(scratch) / "p"
        )
    wall = time.perf_counter() - started
    return {
        "audio_s": result["seconds"],
        "wall_s": wall,
        "utterances": len(result["utterances"]),
        "rejected": len(result["rejects"]),
    }


def clean_child(model: str) -> dict:
    """In the child: score the sample's dev and test clips on one thread; rows and wall seconds."""
    from pipeline.data.aligner import Aligner
    from pipeline.data.clean import judge, score_row, split_rows

    scorer = Aligner(model, threads=1)
    rows = list(split_rows("dev", (str(ROOT / "data/sample/dev.csv"), str(ROOT / "data/sample/test.csv"))))
    started = time.perf_counter()
    verdicts = [judge(score_row("dev", source, row, scorer), 0.5, -5.0) for source, row in rows]
    return {
        "rows": len(rows),
        "wall_s": time.perf_counter() - started,
        "suspect": verdicts.count("suspect_transcript"),
    }


def default_model() -> str:
    """The export of configs/sample.yaml, or an error saying how to build it."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout

    found = Layout(load_config(ROOT / "configs/sample.yaml")).find_export()
    if found is None:
        raise SystemExit("no export of configs/sample.yaml: run make train first, or give --model")
    return str(found.root)


def main(argv=None) -> int:
    """Make (or reuse) the recordings, measure each in a child, then Clean; print the figures and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--minutes", type=int, nargs="+", default=[10, 120])
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache/luigi-deepspeech-bench/align")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # data/generate_recordings.py
    if args.child:
        kind, *rest = args.child
        print(json.dumps(align_child(*rest) if kind == "align" else clean_child(*rest)), flush=True)
        return 0
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    model = args.model or default_model()
    script = str(Path(__file__).resolve())
    figures = {"model": model, "align": {}}
    for minutes in args.minutes:
        audio = make_recording(args.cache_dir, minutes)
        result, rss = run_measured([script, "--child", "align", model, str(audio)])
        result["peak_rss_mib"] = round(rss, 1)
        result["hours_per_hour"] = round(result["audio_s"] / result["wall_s"], 1)
        figures["align"][f"{minutes}min"] = result
        print(
            f"align {minutes} min: {result['audio_s'] / 60:.1f} min of audio in {result['wall_s']:.1f} s "
            f"({result['hours_per_hour']} h of audio per hour), {result['utterances']} utterances, "
            f"{result['rejected']} rejected, peak RSS {rss:.0f} MiB",
            flush=True,
        )
    sizes = [figures["align"][f"{m}min"] for m in args.minutes]
    if len(sizes) > 1:
        figures["peak_rss_ratio_longest_to_shortest"] = round(
            sizes[-1]["peak_rss_mib"] / sizes[0]["peak_rss_mib"], 3
        )
        figures["speed_ratio_longest_to_shortest"] = round(
            sizes[-1]["hours_per_hour"] / sizes[0]["hours_per_hour"], 3
        )
    result, rss = run_measured([script, "--child", "clean", model])
    result["utterances_per_s"] = round(result["rows"] / result["wall_s"], 1)
    result["peak_rss_mib"] = round(rss, 1)
    figures["clean"] = result
    print(f"clean: {result['rows']} utterances in {result['wall_s']:.1f} s ({result['utterances_per_s']}/s)")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
