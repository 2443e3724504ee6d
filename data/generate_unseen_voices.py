"""Generate a test set spoken by voices the sample corpus never uses, to measure how a model trained
on the sample generalises (README: "Augmentation").

Voices: espeak-ng accents and variants outside ``generate_corpus.VOICES`` (Scottish, Lancaster, West
Midlands, and the base voices with other variants). Text: sentences of ``data/sample/lm_corpus.txt``
that no training utterance says (they are in the LM text, as the sample's own test sentences are not:
say so when comparing). Writes ``<out>/unseen.csv`` and ``<out>/unseen/*.flac``. Needs
``apt-get install -y espeak-ng sox``; the committed output means nobody else needs them.

    python data/generate_unseen_voices.py --out data/unseen
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from multiprocessing import Pool
from pathlib import Path

from generate_corpus import VOICES, synthesise

UNSEEN_VOICES = (
    "en-gb-scotland",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-us+m7",
    "en-gb+f3",
    "en-029+klatt2",
    "en-us+croak",
    "en-gb-scotland+f5",
)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=Path, default=Path(__file__).parent / "sample")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "unseen")
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args(argv)
    assert not set(UNSEEN_VOICES) & set(VOICES)
    with open(args.sample / "train.csv", newline="", encoding="utf-8") as handle:
        trained = {row["transcript"] for row in csv.DictReader(handle)}
    candidates = [
        line
        for line in (args.sample / "lm_corpus.txt").read_text(encoding="utf-8").splitlines()
        if line and line not in trained and 4 <= len(line.split()) <= 14
    ]
    rng = random.Random(args.seed)
    texts = rng.sample(candidates, args.count)
    (args.out / "unseen").mkdir(parents=True, exist_ok=True)
    jobs = [
        (
            text,
            str(args.out / "unseen" / f"{i:05d}.flac"),
            UNSEEN_VOICES[i % len(UNSEEN_VOICES)],
            rng.randint(145, 195),
            rng.randint(30, 70),
            rng.randint(18, 32),
        )
        for i, text in enumerate(texts)
    ]
    with Pool(2) as pool:
        seconds = pool.map(synthesise, jobs)
    with open(args.out / "unseen.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["wav_filename", "wav_filesize", "transcript"])
        for job in jobs:
            writer.writerow([str(Path(job[1]).relative_to(args.out)), Path(job[1]).stat().st_size, job[0]])
    print(
        f"unseen: {len(jobs)} utterances, {sum(seconds) / 60:.1f} minutes, voices {', '.join(UNSEEN_VOICES)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
