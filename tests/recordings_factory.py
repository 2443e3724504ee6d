"""Long recordings whose sentence boundaries are known, for the Align tests: ``data/generate_recordings.py``
(espeak-ng speaks each sentence, pauses of random length join them) with the sample corpus's words, skipped
without espeak-ng and sox."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from data import generate_recordings

# The sample corpus's text (King James Version clauses), so that an aligner trained on it knows the words.
SENTENCES = (
    "in the beginning god created the heaven and the earth",
    "and the earth was without form and void",
    "and darkness was upon the face of the deep",
    "and god said let there be light and there was light",
    "and god saw the light that it was good",
    "and god divided the light from the darkness",
    "and god called the light day and the darkness he called night",
    "and the evening and the morning were the first day",
    "and god made the firmament",
    "and it was so",
    "and god called the firmament heaven",
    "and god said let the waters under the heaven be gathered together unto one place",
    "and let the dry land appear",
    "and god called the dry land earth",
    "and the gathering together of the waters called he seas",
    "and god saw that it was good",
    "and the earth brought forth grass",
    "and the herb yielding seed after his kind",
    "and the tree yielding fruit whose seed was in itself",
    "and god set them in the firmament of the heaven to give light upon the earth",
)


def make_recording(path: Path, sentences: list[str], seed: int, **kwargs) -> list[tuple[float, float]]:
    """``generate_recordings.make_recording``, or a skip naming the packages it needs."""
    if shutil.which("espeak-ng") is None or shutil.which("sox") is None:
        pytest.skip(
            "espeak-ng and sox are not installed: apt-get install espeak-ng sox (make test does, as root)"
        )
    return generate_recordings.make_recording(path, sentences, seed, **kwargs)
