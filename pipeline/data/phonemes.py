"""Transcripts as phonemes: IPA from espeak-ng (``espeak-ng -q --ipa``), for a multi-task config's auxiliary
``targets: phonemes`` task.

Each transcript, normalised as its task's transcripts are (``data.text``), is spoken by espeak-ng in its
language's voice; its IPA comes back a clause per line, joined here with spaces. Stress marks (ˈ ˌ) are
dropped: they mark syllables, not sounds, and would be labels of their own; espeak-ng's liaison marks and
any other punctuation become spaces (``PHONEME_TEXT``). One espeak-ng process per transcript, several at a
time: a process gives exactly one transcript's IPA, whatever punctuation or line breaks it holds.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

from native_client.text import TranscriptRejected, normalise_transcript
from pipeline.config import PHONEME_TEXT

# The marks espeak-ng's IPA puts before a stressed syllable (primary, secondary).
STRESS_MARKS = str.maketrans("", "", "\u02c8\u02cc")


class PhonemizerError(RuntimeError):
    """espeak-ng is missing, or does not speak the voice asked for; the message says which and what to do."""


def espeak() -> str:
    """The espeak-ng program; PhonemizerError when it is not installed."""
    found = shutil.which("espeak-ng")
    if found is None:
        raise PhonemizerError(
            "multitask: a targets: phonemes task needs espeak-ng (Debian: apt-get install espeak-ng)"
        )
    return found


def espeak_version() -> str:
    """espeak-ng's version line (in the Phonemes fingerprint: another version may speak otherwise), or
    ``none`` when it is not installed (the stage then fails with one line)."""
    try:
        result = subprocess.run([espeak(), "--version"], capture_output=True, text=True, timeout=60)
    except PhonemizerError:
        return "none"
    return result.stdout.split("Data at")[0].strip()


def phoneme_voice(language: str) -> str:
    """The espeak-ng voice of transcripts in ``language`` (``data.text.language``, a BCP 47 code, which
    espeak-ng's voice names follow: fr, en-us, pt-br); English when none is given, as the project's
    default alphabet is."""
    return language.lower() or "en"


def check_voice(voice: str) -> None:
    """PhonemizerError unless espeak-ng speaks ``voice``."""
    result = subprocess.run([espeak(), "-q", "--ipa", "-v", voice, "a"], capture_output=True, text=True)
    if result.returncode != 0:
        raise PhonemizerError(
            f"espeak-ng has no voice {voice!r} (the of task's data.text.language): see espeak-ng --voices"
        )


def phonemes(ipa: str) -> str:
    """espeak-ng's IPA output as a transcript: its lines joined, stress marks dropped, normalised with
    ``PHONEME_TEXT`` (empty when nothing is left)."""
    text = " ".join(ipa.split()).translate(STRESS_MARKS)
    try:
        return normalise_transcript(text, PHONEME_TEXT)
    except TranscriptRejected:
        return ""


def _speak(program: str, voice: str, text: str) -> str:
    if not text:
        return ""
    result = subprocess.run([program, "-q", "--ipa", "-v", voice, text], capture_output=True, text=True)
    if result.returncode != 0:
        raise PhonemizerError(f"espeak-ng failed on {text!r} (voice {voice}): {result.stderr.strip()[:200]}")
    return phonemes(result.stdout)


def phonemize(texts: Iterable[str], voice: str, workers: int = 4) -> Iterator[str]:
    """The phonemes of each text (already normalised; empty ones stay empty), in order, spoken by
    ``workers`` espeak-ng processes at a time."""
    program = espeak()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        yield from pool.map(lambda text: _speak(program, voice, text), texts)
