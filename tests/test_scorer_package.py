"""The DeepSpeech/Coqui ``.scorer`` reader on hostile packages: a scorer is a file people download, so any
bytes are refused in one line naming the file, in time and memory bounded by the file (issue 37 row 1)."""

from __future__ import annotations

import json
import math
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from native_client.alphabet import Alphabet
from native_client.scorer_package import MAX_WORDS, ScorerPackageError, read_scorer_package
from tests.conftest import ROOT
from tests.scorer_factory import fst_package, package_bytes, trie_layout

ALPHABET = Alphabet(tuple(" abcdefghijklmnopqrstuvwxyz'"))
WORDS = sorted(
    set(
        "the quick brown fox jumps over a lazy dog and then some words share their prefixes prefix "
        "pre press pressed presses dogs doing done don't do did it its it's one once only open opened "
        "zebra zebras zoo zoom zoomed".split()
    )
)


def _refusal(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    with pytest.raises(ScorerPackageError) as caught:
        read_scorer_package(path, ALPHABET)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message


def _int32(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + struct.pack("<i", value) + data[offset + 4 :]


def test_a_valid_package_is_read(tmp_path):
    path = tmp_path / "ok.scorer"
    path.write_bytes(package_bytes(WORDS, ALPHABET, 0.5, 1.5))
    package = read_scorer_package(path, ALPHABET)
    assert package.words == tuple(WORDS) and (package.alpha, package.beta) == (0.5, 1.5)


def test_hostile_vocabularies_and_weights_are_refused_in_one_line(tmp_path):
    """A cycle made the reader grow to gigabytes, an arc past the last state was an IndexError, an arc to -1
    silently gave an empty vocabulary, NaN alpha and infinite beta were accepted."""
    path = tmp_path / "hostile.scorer"
    good = package_bytes(WORDS, ALPHABET)
    at = trie_layout(good)
    first_arc_next = at["arcs"] + 12  # arc 0 leaves the start state with the first letter of a word
    assert "has a cycle" in _refusal(path, _int32(good, first_arc_next, 0))
    assert f"an arc to state {at['n_states']}, outside its {at['n_states']} states" in _refusal(
        path, _int32(good, first_arc_next, at["n_states"])
    )
    assert "an arc to state -1, outside its" in _refusal(path, _int32(good, first_arc_next, -1))
    alpha_nan = good[: at["alpha"]] + struct.pack("<d", math.nan) + good[at["alpha"] + 8 :]
    assert "its default alpha is nan, not a finite number" in _refusal(path, alpha_nan)
    beta_inf = good[: at["beta"]] + struct.pack("<d", math.inf) + good[at["beta"] + 8 :]
    assert "its default beta is inf, not a finite number" in _refusal(path, beta_inf)
    # State 1's arcs said to start where state 0's do: overlapping ranges would multiply the arcs walked.
    assert "not an OpenFST ConstFst" in _refusal(path, _int32(good, at["states"] + 20 + 4, 0))
    space, a, b = (ALPHABET.labels.index(ch) + 1 for ch in " ab")
    # An acyclic FST of 42 states that spells 2**40 words: refused from counting, never listed.
    layers = [[(a, i + 1), (b, i + 1)] for i in range(40)] + [[(space, 41)], []]
    assert f"spells more than {MAX_WORDS:,} words" in _refusal(path, fst_package(layers, final={41: True}))


def fuzz(seed: int, count: int, directory: Path) -> dict:
    """``count`` random mutations of a valid package, each read: what happened, as counts, with every
    exception other than ScorerPackageError (and any refusal not in one line naming the file) listed."""
    rng = random.Random(seed)
    good = package_bytes(WORDS, ALPHABET)
    at = trie_layout(good)
    trie = good.rfind(b"EIRT")
    path = directory / "fuzzed.scorer"
    interesting = [-1, 0, 1, at["n_states"] - 1, at["n_states"], at["n_states"] + 1, 2**31 - 1, -(2**31)]
    outcomes = {"read": 0, "refused": 0, "wrong": []}
    for number in range(count):
        data, kind = bytearray(good), rng.choice(("bytes", "int32", "header", "weights", "cut", "splice"))
        if kind == "bytes":  # a few random bytes, mostly in the trie
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(trie if rng.random() < 0.9 else 0, len(data))] = rng.randrange(256)
        elif kind == "int32":  # a field of a state or an arc set to a value that matters
            offset = at["states"] + 4 * rng.randrange((len(data) - at["states"]) // 4)
            data[offset : offset + 4] = struct.pack(
                "<i", rng.choice(interesting + [rng.randrange(-999, 999)])
            )
        elif kind == "header":  # start state, number of states or of arcs
            offset = at["first"] + 8 * rng.randrange(3)
            value = rng.choice(interesting + [2**62, -(2**62), rng.randrange(-(2**40), 2**40)])
            data[offset : offset + 8] = struct.pack("<q", value)
        elif kind == "weights":
            offset = rng.choice((at["alpha"], at["beta"]))
            data[offset : offset + 8] = struct.pack("<d", rng.choice((math.nan, math.inf, -math.inf, 1e308)))
        elif kind == "cut":
            del data[rng.randrange(trie, len(data)) :]
        else:  # bytes inserted into the trie or taken out of it
            offset = rng.randrange(trie, len(data))
            if rng.random() < 0.5:
                data[offset:offset] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
            else:
                del data[offset : offset + rng.randint(1, 32)]
        path.write_bytes(bytes(data))
        try:
            package = read_scorer_package(path, ALPHABET)
        except ScorerPackageError as error:
            outcomes["refused"] += 1
            if not str(error).startswith(f"{path}: ") or "\n" in str(error):
                outcomes["wrong"].append(f"mutation {number} ({kind}): {error}")
        except Exception as error:  # what the test is for: anything else is a failure, listed
            outcomes["wrong"].append(f"mutation {number} ({kind}): {type(error).__name__}: {error}")
        else:
            outcomes["read"] += 1
            if not (
                math.isfinite(package.alpha)
                and math.isfinite(package.beta)
                and len(package.words) <= MAX_WORDS
                and all(not ALPHABET.unknown_characters(word) for word in package.words)
            ):
                outcomes["wrong"].append(f"mutation {number} ({kind}): read as {package}")
    return outcomes


FUZZ_CHILD = """
import json, resource, sys
from pathlib import Path
# A guard for the machine: an allocation past 1 GiB more than now fails (MemoryError, listed) instead of
# growing until the system kills something.
with open("/proc/self/status") as status:
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))
from tests.test_scorer_package import fuzz
outcomes = fuzz(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
# VmHWM, not getrusage's ru_maxrss: that one keeps the peak of the process this one was forked from
# before its exec (a pytest worker holding TensorFlow: gigabytes), VmHWM is this program's own.
with open("/proc/self/status") as status:
    peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
outcomes["peak_rss_mb"] = peak_kib / 1024
print(json.dumps(outcomes))
"""


def test_thousands_of_mutations_of_a_package_are_read_or_refused_in_one_line(tmp_path):
    """3,000 random mutations (bytes, fields set to -1/0/n_states/..., header counts, NaN and infinite
    weights, cuts, bytes inserted or removed) of a valid package: each is read as a vocabulary of the
    alphabet or refused by a one-line error naming the file; no other exception, in bounded memory (the
    child process's peak) and without hanging (the timeout is a guard, not a measure)."""
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", FUZZ_CHILD, "37", "3000", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    outcomes = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcomes["wrong"] == []
    assert outcomes["read"] > 100 and outcomes["refused"] > 1000, outcomes
    assert outcomes["peak_rss_mb"] < 400, outcomes
