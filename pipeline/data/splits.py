"""Speaker-disjoint splits for corpora without official ones: a speaker's split is a pure function of
its id, so every utterance of a speaker lands in the same split, on every machine and every run,
without holding any list of speakers."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

SPLITS = ("train", "dev", "test")
DEFAULT_FRACTIONS = {"train": 0.9, "dev": 0.05, "test": 0.05}


def check_fractions(fractions: Mapping[str, float], where: str = "split_fractions") -> dict[str, float]:
    """The fractions as a dict in split order; ValueError naming ``where`` unless they are known split
    names with non-negative values that add up to 1."""
    unknown = sorted(set(fractions) - set(SPLITS))
    if unknown:
        raise ValueError(f"{where}: unknown split(s) {', '.join(unknown)}; expected {', '.join(SPLITS)}")
    values = {split: float(fractions.get(split, 0.0)) for split in SPLITS}
    if any(value < 0 for value in values.values()):
        raise ValueError(f"{where}: fractions must not be negative: {values}")
    if abs(sum(values.values()) - 1.0) > 1e-6:
        raise ValueError(f"{where}: fractions add up to {sum(values.values()):g}, not 1: {values}")
    return values


def speaker_position(speaker: str, salt: str = "") -> float:
    """Where ``speaker`` falls in [0, 1): the first 8 bytes of BLAKE2b(salt, speaker) as a fraction."""
    digest = hashlib.blake2b(f"{salt}\0{speaker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def split_of(speaker: str, fractions: Mapping[str, float], salt: str = "") -> str:
    """The split of ``speaker``: train, dev, test take consecutive shares of [0, 1) by ``fractions``
    (checked by ``check_fractions``). ``salt`` reshuffles which speakers go where."""
    position, start = speaker_position(speaker, salt), 0.0
    chosen = ""
    for split in SPLITS:
        share = fractions.get(split, 0.0)
        if share > 0:
            chosen = split
            if position < start + share:
                return split
            start += share
    return chosen  # rounding left the very top of [0, 1): the last split with a share
