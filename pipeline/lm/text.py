"""The LM text: corpus files and training transcripts, normalised (``data.text``) and limited to the model's
labels, streamed sentence by sentence."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from native_client.alphabet import Labels
from pipeline.config import Config
from pipeline.data.manifests import read_manifests
from pipeline.data.text import TextSettings, TranscriptRejected, normalise_transcript
from pipeline.lm.kneser_ney import LanguageModelError


def clean_line(line: str, alphabet: Labels, text: TextSettings) -> str:
    """Normalise like transcripts (``normalise_transcript`` with ``text``) and drop characters outside the
    alphabet (none with byte labels); "" for a line that normalises to nothing (or holds digits that
    ``data.text.digits`` rejects)."""
    try:
        normalised = normalise_transcript(line, text)
    except TranscriptRejected:
        return ""
    unknown = set(alphabet.unknown_characters(normalised))
    if unknown:
        normalised = "".join(ch for ch in normalised if ch not in unknown)
    return " ".join(normalised.split())


def lm_sentences(
    config: Config, alphabet: Labels, stats: Counter, manifests: dict[str, tuple[str, ...]] | None = None
) -> Iterator[str]:
    """The LM text, one normalised sentence per item; ``stats`` counts lines read, used and emptied.
    ``manifests``: every manifest of each split (``Layout.split_manifests``: imported corpora too);
    default the config's ``data.<split>_files``."""
    manifests = manifests or {split: config.split_files(split) for split in ("train", "dev", "test")}
    held_out = {Path(f).resolve() for split in ("dev", "test") for f in manifests[split]}
    for path in config.decoder.lm_corpus_files:
        if Path(path).resolve() in held_out:
            raise LanguageModelError(
                f"decoder.lm_corpus_files: {path} is a dev/test manifest; the LM must not see held-out text"
            )
        try:
            handle = open(path, encoding="utf-8", errors="replace")
        except OSError as error:
            raise LanguageModelError(f"decoder.lm_corpus_files: {path}: {error.strerror}") from error
        with handle:
            for line in handle:
                stats["corpus_lines"] += 1
                sentence = clean_line(line, alphabet, config.data.text)
                if sentence:
                    stats["sentences"] += 1
                    yield sentence
                else:
                    stats["empty_lines"] += 1
    if config.decoder.lm_include_train:
        samples, _ = read_manifests(manifests["train"], config.data.limit_train, alphabet, config.data.text)
        for sample in samples:
            stats["train_transcripts"] += 1
            stats["sentences"] += 1
            yield sample.transcript


class HeldOutCheck:
    """Counts dev/test transcripts that appear verbatim in the LM text, from digests of the held-out
    transcripts only: the LM text streams past and is never collected."""

    def __init__(self, config: Config, alphabet: Labels, manifests: dict[str, tuple[str, ...]] | None = None):
        """``manifests``: as ``lm_sentences`` takes them."""
        self._counts: Counter = Counter()
        manifests = manifests or {split: config.split_files(split) for split in ("dev", "test")}
        for split in ("dev", "test"):
            samples, _ = read_manifests(
                manifests[split], config.split_limit(split), alphabet, config.data.text
            )
            self._counts.update(_digest(s.transcript) for s in samples)
        self._seen: set[bytes] = set()

    def see(self, sentence: str) -> None:
        """Look at one LM sentence."""
        if self._counts:
            key = _digest(sentence)
            if key in self._counts:
                self._seen.add(key)

    @property
    def overlap(self) -> int:
        """How many dev/test transcripts appeared among the sentences seen (reported, should be 0)."""
        return sum(self._counts[key] for key in self._seen)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def char_tokens(sentence: str, alphabet: Labels) -> list[str]:
    """A sentence as the character LM's tokens: one per label (a character, or a UTF-8 byte with byte
    labels; the space as ``|``), as the beam decoder names them (``Labels.tokens``)."""
    return alphabet.to_tokens(sentence)
