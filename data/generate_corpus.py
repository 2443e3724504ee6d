"""Generate the embedded sample corpus: synthetic English speech with espeak-ng.

Text: clauses of the King James Version of the Bible (public domain), read
from Debian's ``bible-kjv`` package. Speech: espeak-ng with several voices,
speaking rates, pitches and loudness, converted by sox to 16 kHz mono 16-bit
FLAC with leading and trailing silence trimmed.

Writes ``<out>/{train,dev,test}.csv`` (DeepSpeech format, paths relative to
the CSV's folder), the audio under ``<out>/{train,dev,test}/`` and
``<out>/lm_corpus.txt`` (sentences for the language model: none from dev or
test). Needs ``apt-get install -y espeak-ng sox bible-kjv``; the committed
output means nobody else needs them.

    python data/generate_corpus.py --out data/sample
"""

from __future__ import annotations

import argparse
import csv
import random
import re
import subprocess
import sys
import tempfile
from multiprocessing import Pool
from pathlib import Path

VOICES = ("en-us", "en-us+f2", "en", "en-gb-x-rp+m3", "en-029", "en-us+f4")
_VERSE = re.compile(r"^\s+\d+\s+(.*)$")
_CLAUSE_END = re.compile(r"[.;:?!()]")
_NOT_WORD = re.compile(r"[^a-z' ]+")


def kjv_verses() -> list[str]:
    """All verses of the KJV as plain lines, via the ``bible`` program."""
    out = subprocess.run(
        ["bible", "-l100000", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True
    ).stdout
    return [m.group(1) for line in out.splitlines() if (m := _VERSE.match(line))]


def clauses(verses: list[str], min_words: int, max_words: int) -> list[str]:
    """Split verses into clauses, normalise to the sample alphabet, keep those of a speakable length."""
    seen: set[str] = set()
    result = []
    for verse in verses:
        for part in _CLAUSE_END.split(verse):
            if any(ch.isdigit() for ch in part):
                continue
            text = _NOT_WORD.sub(" ", part.lower().replace("-", " "))
            text = " ".join(w.strip("'") for w in text.split() if w.strip("'"))
            if min_words <= len(text.split()) <= max_words and text not in seen:
                seen.add(text)
                result.append(text)
    return result


def synthesise(job: tuple[str, str, str, int, int, int]) -> float:
    """Speak one text into a FLAC file; return its duration in seconds."""
    text, path, voice, rate, pitch, amplitude = job
    with tempfile.NamedTemporaryFile(suffix=".wav") as raw:
        subprocess.run(
            [
                "espeak-ng",
                "-v",
                voice,
                "-s",
                str(rate),
                "-p",
                str(pitch),
                "-a",
                str(amplitude),
                "-w",
                raw.name,
                text,
            ],
            check=True,
        )
        subprocess.run(
            [
                "sox",
                "-R",  # the same dither noise on every run, so a corpus spoken again is the same corpus
                raw.name,
                "-r",
                "16000",
                "-c",
                "1",
                "-b",
                "16",
                "-C",
                "8",
                path,
                "silence",
                "1",
                "0.02",
                "0.5%",
                "reverse",
                "silence",
                "1",
                "0.02",
                "0.5%",
                "reverse",
            ],
            check=True,
        )
    out = subprocess.run(["soxi", "-D", path], check=True, capture_output=True, text=True).stdout
    return float(out)


def make_split(
    out: Path,
    split: str,
    texts: list[str],
    rng: random.Random,
    pool: Pool,
    target_seconds: float,
    batch: int = 64,
) -> list[str]:
    """Synthesise ``texts`` in order until ``target_seconds`` of audio exist;
    write the CSV; return the texts used."""
    (out / split).mkdir(parents=True, exist_ok=True)
    rows, total, used = [], 0.0, []
    position = 0
    while total < target_seconds and position < len(texts):
        chunk = texts[position : position + batch]
        jobs = []
        for offset, text in enumerate(chunk):
            name = f"{split}/{position + offset:05d}.flac"
            jobs.append(
                (
                    text,
                    str(out / name),
                    rng.choice(VOICES),
                    rng.randint(145, 195),
                    rng.randint(30, 70),
                    rng.randint(18, 32),
                )
            )
        for job, seconds in zip(jobs, pool.map(synthesise, jobs), strict=False):
            if total >= target_seconds:
                Path(job[1]).unlink()
                continue
            relative = str(Path(job[1]).relative_to(out))
            rows.append((relative, Path(job[1]).stat().st_size, job[0]))
            used.append(job[0])
            total += seconds
        position += batch
    with open(out / f"{split}.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["wav_filename", "wav_filesize", "transcript"])
        writer.writerows(rows)
    print(f"{split}: {len(rows)} utterances, {total / 60:.1f} minutes", file=sys.stderr)
    return used


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "sample")
    parser.add_argument("--train-minutes", type=float, default=31.0)
    parser.add_argument("--dev-minutes", type=float, default=2.5)
    parser.add_argument("--test-minutes", type=float, default=2.5)
    parser.add_argument("--lm-sentences", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    texts = clauses(kjv_verses(), min_words=4, max_words=14)
    rng.shuffle(texts)
    test_texts, dev_texts, rest = texts[:200], texts[200:400], texts[400:]
    args.out.mkdir(parents=True, exist_ok=True)
    with Pool(2) as pool:
        used_test = make_split(args.out, "test", test_texts, rng, pool, args.test_minutes * 60)
        used_dev = make_split(args.out, "dev", dev_texts, rng, pool, args.dev_minutes * 60)
        used_train = make_split(args.out, "train", rest, rng, pool, args.train_minutes * 60)
    held_out = set(test_texts) | set(dev_texts)
    lm_texts = used_train + [t for t in rest[len(used_train) :] if t not in held_out]
    (args.out / "lm_corpus.txt").write_text("\n".join(lm_texts[: args.lm_sentences]) + "\n", encoding="utf-8")
    print(
        f"lm corpus: {min(len(lm_texts), args.lm_sentences)} sentences; "
        f"{len(used_test)} test, {len(used_dev)} dev, {len(used_train)} train",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
