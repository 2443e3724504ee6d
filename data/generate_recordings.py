"""Generate long recordings with their whole text: sentences spoken by espeak-ng one by one and joined with
pauses of random length, as 16 kHz mono FLAC beside a ``.txt`` (the ``recordings`` importer's layout).

The sentences are the sample corpus's language-model text (``data/sample/lm_corpus.txt``: King James
Version clauses, none from its dev or test split), written back as prose: capitalised, with a full stop,
a few sentences to a paragraph line. Where each sentence's speech starts and ends is known (the first and
last sample above a quiet threshold), which is what the tests check an aligner against
(``tests/recordings_factory.py``). ``--unread`` adds a paragraph the reader never reads to the first
chapter's text, as a book's preface is: the Align stage must reject it. Needs espeak-ng and sox.

    python data/generate_recordings.py --out data/recordings --sentences 24   # the committed sample
"""

from __future__ import annotations

import argparse
import random
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile

RATE = 16000
VOICES = ("en-us", "en-us+f2", "en", "en-gb-x-rp+m3")
UNREAD = "This edition was prepared from the text of the King James Version. The notes are not read aloud."


def speak(sentence: str, voice: str, speed: int) -> np.ndarray:
    """``sentence`` spoken by espeak-ng's ``voice`` at ``speed`` words per minute: 16 kHz int16 samples,
    trimmed to its speech."""
    with tempfile.TemporaryDirectory() as scratch:
        raw, wav = Path(scratch) / "raw.wav", Path(scratch) / "16k.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), sentence], check=True)
        subprocess.run(["sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(wav)], check=True)
        samples, _ = soundfile.read(wav, dtype="int16")
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > 300)
    return samples[loud[0] : loud[-1] + 1] if len(loud) else samples[:0]


def make_recording(
    path: Path, sentences: list[str], seed: int, pauses: tuple[float, float] = (0.3, 1.2), lead: float = 0.5
) -> list[tuple[float, float]]:
    """Write ``path`` (FLAC): ``sentences`` in one voice (chosen by ``seed``), pauses of random length
    between them; returns each sentence's (start, end) of speech in seconds."""
    rng = random.Random(seed)
    voice, speed = rng.choice(VOICES), rng.randint(150, 190)
    pieces = [np.zeros(int(lead * RATE), np.int16)]
    spans, at = [], len(pieces[0])
    for sentence in sentences:
        speech = speak(sentence, voice, speed)
        spans.append((at / RATE, (at + len(speech)) / RATE))
        pause = np.zeros(int(rng.uniform(*pauses) * RATE), np.int16)
        pieces += [speech, pause]
        at += len(speech) + len(pause)
    soundfile.write(path, np.concatenate(pieces), RATE, format="FLAC")
    return spans


def prose(sentences: list[str], per_line: int) -> str:
    """``sentences`` as a book writes them: capitalised, a full stop each, ``per_line`` to a paragraph."""
    written = [s[0].upper() + s[1:] + "." for s in sentences]
    return "\n".join(" ".join(written[i : i + per_line]) for i in range(0, len(written), per_line)) + "\n"


def main() -> None:
    """Write ``--chapters`` recordings of ``--sentences`` sentences each under ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--chapters", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=30)
    parser.add_argument("--text", type=Path, default=Path(__file__).parent / "sample" / "lm_corpus.txt")
    parser.add_argument("--no-unread", dest="unread", action="store_false")
    args = parser.parse_args()
    lines = [line.strip() for line in args.text.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if 4 <= len(line.split()) <= 14]
    rng = random.Random(48)
    args.out.mkdir(parents=True, exist_ok=True)
    for chapter in range(args.chapters):
        sentences = rng.sample(lines, args.sentences)
        name = f"chapter{chapter + 1:02d}"
        spans = make_recording(args.out / f"{name}.flac", sentences, seed=chapter)
        text = prose(sentences, per_line=3)
        if args.unread and chapter == 0:
            text = UNREAD + "\n" + text
        (args.out / f"{name}.txt").write_text(text, encoding="utf-8")
        print(f"{name}: {len(sentences)} sentences, {spans[-1][1]:.1f} s")


if __name__ == "__main__":
    main()
