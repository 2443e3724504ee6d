"""Hot words on real logits: does boosting a word the beam search missed bring it back, and at what cost?

Logits: an export's model over the sample test split (default: the configs/sample.yaml export; run
`make train` first, or pass --export). For every reference word the beam search (the export's own
decoder, its LM and weights) left out, and that the alphabet can spell, the utterance is decoded
again with that word boosted (``--hot_words word:B``, one word at a time): "recovered" counts the
words that then appear, and the utterance's word errors are summed before and after. As a control,
each utterance is also decoded with a vocabulary word that is not in its reference boosted: "false"
counts those that then appear. With --char-lm (a character ARPA, as LanguageModel writes with
``decoder.lexicon: false``) the same is measured lexicon-free. One core. Last line: one JSON object
{"lexicon": {"B": {"missed", "recovered", "errors_before", "errors_after", "false", "controls",
"seconds_per_utterance", "plain_seconds_per_utterance"}, ...}, "lexicon_free": {...}, "cpu": ...}.

    python bench/hot_words.py [--export DIR] [--char-lm chars.arpa] [--boosts 2 5 10] [--limit N]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def word_errors(reference: str, hypothesis: str) -> int:
    """Word-level edit distance."""
    from rapidfuzz.distance import Levenshtein

    return Levenshtein.distance(reference.split(), hypothesis.split())


def measure(spec, logits, references, vocabulary, boosts, labels) -> dict:
    """Recovery and false-insertion counts of single-word boosts with the decoder ``spec`` describes."""
    import dataclasses

    from native_client.decoders import build_decoder

    plain_decoder = build_decoder(spec)
    started = time.perf_counter()
    plain = [plain_decoder.decode(item) for item in logits]
    plain_s = (time.perf_counter() - started) / len(logits)
    letters = set(labels) - {" "}
    rng = random.Random(0)
    results = {}
    for boost in boosts:
        row = dict(missed=0, recovered=0, errors_before=0, errors_after=0, false=0, controls=0)
        seconds, decodes = 0.0, 0
        for item, reference, hypothesis in zip(logits, references, plain, strict=True):
            missed = [w for w in dict.fromkeys(reference.split()) if w not in hypothesis.split()]
            control = rng.choice([w for w in vocabulary if w not in reference.split() and len(w) > 2])
            for word, is_control in [*((w, False) for w in missed if set(w) <= letters), (control, True)]:
                settings = {**spec.settings, "hot_words": {word: float(boost)}}
                decoder = build_decoder(dataclasses.replace(spec, settings=settings))
                started = time.perf_counter()
                text = decoder.decode(item)
                seconds, decodes = seconds + time.perf_counter() - started, decodes + 1
                found = word in text.split()
                if is_control:
                    row["controls"] += 1
                    row["false"] += found
                else:
                    row["missed"] += 1
                    row["recovered"] += found
                    row["errors_before"] += word_errors(reference, hypothesis)
                    row["errors_after"] += word_errors(reference, text)
        row["seconds_per_utterance"] = round(seconds / max(decodes, 1), 4)
        row["plain_seconds_per_utterance"] = round(plain_s, 4)
        results[str(boost)] = row
        print(f"boost {boost}: {row}", flush=True)
    return results


def main(argv=None) -> int:
    """Compute the logits, measure with the export's decoder (and lexicon-free with --char-lm)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", help="export directory (default: the configs/sample.yaml export)")
    parser.add_argument("--char-lm", help="a character ARPA: measure lexicon-free decoding too")
    parser.add_argument("--boosts", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    parser.add_argument("--limit", type=int, default=0, help="test utterances (0 = all)")
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    import dataclasses

    from native_client import Model
    from native_client.audio import load_for_model
    from native_client.export_decoder import decoder_spec_for_export
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout

    found = Layout(load_config(ROOT / "configs" / "sample.yaml")).find_export()
    export = Path(args.export) if args.export else (found.root if found else None)
    if export is None:
        print("no export of configs/sample.yaml: run `make train` first (or pass --export)", file=sys.stderr)
        return 2
    model = Model(export)
    spec = decoder_spec_for_export(model.metadata)
    if spec is None:
        print(f"{export}: the export has no language model", file=sys.stderr)
        return 2
    rows = list(csv.DictReader(open(ROOT / "data" / "sample" / "test.csv")))[: args.limit or None]
    references = [row["transcript"] for row in rows]
    logits = [
        model.logits(load_for_model(ROOT / "data" / "sample" / row["wav_filename"], model.sample_rate))
        for row in rows
    ]
    vocabulary = spec.words()
    print(f"{len(rows)} utterances, {export}, decoder {spec.type} {dict(spec.settings)}", flush=True)
    figures = {"lexicon": measure(spec, logits, references, vocabulary, args.boosts, spec.labels)}
    if args.char_lm:
        free = dataclasses.replace(
            spec, lm=args.char_lm, vocabulary=None, settings={**spec.settings, "lexicon": False}
        )
        figures["lexicon_free"] = measure(free, logits, references, vocabulary, args.boosts, spec.labels)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    figures["cpu"] = next(
        (line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line), ""
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    sys.exit(main())
