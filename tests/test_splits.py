"""pipeline/data/splits.py: deterministic speaker-disjoint splits by a hash of the speaker id."""

import pytest

from pipeline.data.splits import check_fractions, split_of

FRACTIONS = {"train": 0.8, "dev": 0.1, "test": 0.1}


def test_a_speaker_always_lands_in_the_same_split_and_fractions_hold():
    speakers = [f"speaker-{i}" for i in range(20000)]
    first = [split_of(s, FRACTIONS) for s in speakers]
    assert first == [split_of(s, dict(FRACTIONS)) for s in speakers]
    for split, share in FRACTIONS.items():
        assert abs(first.count(split) / len(speakers) - share) < 0.01
    salted = [split_of(s, FRACTIONS, salt="other") for s in speakers]
    assert salted != first and abs(salted.count("train") / len(speakers) - 0.8) < 0.01


def test_a_zero_share_is_never_chosen():
    chosen = {split_of(f"s{i}", {"train": 0.5, "dev": 0.0, "test": 0.5}) for i in range(2000)}
    assert chosen == {"train", "test"}
    assert {split_of(f"s{i}", {"train": 1.0}) for i in range(100)} == {"train"}


@pytest.mark.parametrize(
    "fractions, message",
    [
        ({"train": 0.9, "dev": 0.2}, "add up to 1.1"),
        ({"train": 1.1, "dev": -0.1}, "must not be negative"),
        ({"train": 0.9, "valid": 0.1}, "unknown split"),
    ],
)
def test_bad_fractions_are_named(fractions, message):
    with pytest.raises(ValueError, match=message):
        check_fractions(fractions, "data.corpora[0].split_fractions")
