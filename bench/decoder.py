"""Beam search speed and accuracy: flashlight-text (ours) vs pyctcdecode vs greedy, on the same logits and LM.

Logits: the exported configs/sample.yaml model (run `make train` first) over
the sample test split. LM: the export's word ARPA and vocabulary, with its
alpha/beta for both decoders. pyctcdecode needs numpy < 2, so it runs in its
own venv (`.venv-pyctcdecode`, created on first use from
bench/pyctcdecode-requirements.txt) on the same saved log-probabilities.
Both decoders get one core. Last line: one JSON object
{"beams": {"16": {"flashlight_s", "pyctcdecode_s", "speedup", "flashlight_wer", "pyctcdecode_wer"}, ...},
"greedy_wer": ...}.

    python bench/decoder.py [--export DIR] [--beams 16 64 256 1024]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BENCH_VENV = ROOT / ".venv-pyctcdecode"


def ensure_bench_venv() -> Path:
    """pyctcdecode's own venv (created once); returns its python."""
    python = BENCH_VENV / "bin" / "python"
    stamp = BENCH_VENV / ".installed"
    requirements = ROOT / "bench" / "pyctcdecode-requirements.txt"
    if not stamp.is_file() or stamp.read_text() != requirements.read_text():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(requirements)], check=True)
        stamp.write_text(requirements.read_text())
    return python


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER."""
    from rapidfuzz.distance import Levenshtein

    errors = sum(
        Levenshtein.distance(r.split(), h.split()) for r, h in zip(references, hypotheses, strict=False)
    )
    return errors / sum(len(r.split()) for r in references)


def lm_load_times(alphabet, lm: Path, settings, vocabulary) -> dict:
    """Seconds to set up a decoder (KenLM load and lexicon trie) on the export's LM as ARPA and as a KenLM
    binary (the one made from the other with build_binary when KenLM's tools are installed)."""
    from native_client.arpa import is_arpa
    from native_client.decoders.beam import BeamDecoder
    from pipeline.lm.kenlm_tools import build_binary, find_tools

    def timed(path: Path) -> float:
        started = time.perf_counter()
        BeamDecoder(alphabet, path, settings, vocabulary)
        return round(time.perf_counter() - started, 3)

    times = {"arpa" if is_arpa(lm) else "binary": timed(lm)}
    tools = find_tools()
    if tools and is_arpa(lm):
        with tempfile.TemporaryDirectory() as tmp:
            binary = Path(tmp) / "lm.bin"
            build_binary(tools["build_binary"], lm, binary, 8, Path(tmp) / "log")
            times["binary"] = timed(binary)
    return times


def main(argv=None) -> int:
    """Compute logits, decode with both decoders at each beam width, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", help="export directory (default: the configs/sample.yaml export)")
    parser.add_argument("--beams", type=int, nargs="+", default=[16, 64, 256, 1024])
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    from native_client import Model
    from native_client.audio import load_for_model
    from native_client.decoders.beam import BeamDecoder, BeamSettings
    from native_client.decoders.greedy import log_softmax
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout

    found = Layout(load_config(ROOT / "configs" / "sample.yaml")).find_export()
    export = Path(args.export) if args.export else (found.root if found else None)
    if export is None:
        print("no export of configs/sample.yaml: run `make train` first (or pass --export)", file=sys.stderr)
        return 2
    model = Model(export)
    if not model.metadata.decoder.get("lm"):
        print(f"{export}: the export has no language model", file=sys.stderr)
        return 2
    rows = list(csv.DictReader(open(ROOT / "data" / "sample" / "test.csv")))
    references = [row["transcript"] for row in rows]
    logits = [
        model.logits(load_for_model(ROOT / "data" / "sample" / row["wav_filename"], 16000)) for row in rows
    ]
    log_probs = [log_softmax(utterance_logits) for utterance_logits in logits]
    greedy_wer = word_error_rate(
        references, [model.greedy.decode(utterance_logits) for utterance_logits in logits]
    )
    settings = BeamSettings.from_dict(model.metadata.decoder)
    lm = export / model.metadata.decoder["lm"]
    vocabulary = (export / model.metadata.decoder["vocabulary"]).read_text().split()
    print(
        f"{len(rows)} utterances, LM {lm.name}, alpha {settings.lm_alpha:.3f}, beta {settings.lm_beta:.3f}; "
        f"greedy WER {greedy_wer:.4f}",
        flush=True,
    )

    load_times = lm_load_times(model.metadata.alphabet, lm, settings, vocabulary)
    print(f"decoder set-up (KenLM load + lexicon trie): {load_times}", flush=True)
    flashlight = {}
    for beam in args.beams:
        decoder = BeamDecoder(
            model.metadata.alphabet, lm, dataclasses.replace(settings, beam_width=beam), vocabulary
        )
        decoder.decode(logits[0])
        started = time.perf_counter()
        texts = [decoder.decode(utterance_logits) for utterance_logits in logits]
        flashlight[beam] = (time.perf_counter() - started, word_error_rate(references, texts))
        print(
            f"flashlight beam {beam}: {flashlight[beam][0]:.2f} s, WER {flashlight[beam][1]:.4f}", flush=True
        )

    python = ensure_bench_venv()
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(
            Path(tmp) / "inputs.npz", count=len(log_probs), **{f"u{i}": lp for i, lp in enumerate(log_probs)}
        )
        labels = list(model.metadata.alphabet.labels) + [""]
        (Path(tmp) / "settings.json").write_text(
            json.dumps(
                {
                    "labels": labels,
                    "lm": str(lm),
                    "unigrams": vocabulary,
                    "alpha": settings.lm_alpha,
                    "beta": settings.lm_beta,
                    "beams": args.beams,
                }
            )
        )
        run = subprocess.run(
            [
                str(python),  # inherits this process's one-CPU affinity
                str(ROOT / "bench" / "pyctcdecode_runner.py"),
                str(Path(tmp) / "inputs.npz"),
                str(Path(tmp) / "settings.json"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    table = {}
    for beam in args.beams:
        seconds, wer = flashlight[beam]
        other = theirs[str(beam)]
        other_wer = word_error_rate(references, other["texts"])
        table[str(beam)] = {
            "flashlight_s": round(seconds, 3),
            "pyctcdecode_s": round(other["seconds"], 3),
            "speedup": round(other["seconds"] / seconds, 2),
            "flashlight_wer": round(wer, 4),
            "pyctcdecode_wer": round(other_wer, 4),
        }
        print(f"beam {beam}: {table[str(beam)]}", flush=True)
    print(json.dumps({"beams": table, "greedy_wer": round(greedy_wer, 4), "lm_load_s": load_times}))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    raise SystemExit(main())
