"""The LM text: corpus files and training transcripts, normalised to the alphabet, streamed sentence by sentence."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from native_client.alphabet import Alphabet
from native_client.decoders.beam import SPACE_TOKEN
from pipeline.config import Config
from pipeline.data.manifests import read_manifests
from pipeline.lm.kneser_ney import LanguageModelError


def clean_line(line: str, alphabet: Alphabet) -> str:
    """Normalise like transcripts (case, whitespace) and drop characters outside the alphabet."""
    text = alphabet.normalise(line)
    known = set(alphabet.labels)
    return " ".join("".join(ch for ch in text if ch in known).split())


def lm_sentences(
    config: Config, alphabet: Alphabet, stats: Counter, manifests: dict[str, tuple[str, ...]] | None = None
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
                sentence = clean_line(line, alphabet)
                if sentence:
                    stats["sentences"] += 1
                    yield sentence
                else:
                    stats["empty_lines"] += 1
    if config.decoder.lm_include_train:
        samples, _ = read_manifests(manifests["train"], config.data.limit_train, alphabet)
        for sample in samples:
            stats["train_transcripts"] += 1
            stats["sentences"] += 1
            yield sample.transcript


class HeldOutCheck:
    """Counts dev/test transcripts that appear verbatim in the LM text, from digests of the held-out
    transcripts only: the LM text streams past and is never collected."""

    def __init__(
        self, config: Config, alphabet: Alphabet, manifests: dict[str, tuple[str, ...]] | None = None
    ):
        """``manifests``: as ``lm_sentences`` takes them."""
        self._counts: Counter = Counter()
        manifests = manifests or {split: config.split_files(split) for split in ("dev", "test")}
        for split in ("dev", "test"):
            samples, _ = read_manifests(manifests[split], config.split_limit(split), alphabet)
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


def char_tokens(sentence: str) -> list[str]:
    """A sentence as character tokens for the character LM (space written as ``SPACE_TOKEN``)."""
    return [SPACE_TOKEN if ch == " " else ch for ch in sentence]
