"""DeepSpeech 0.7+/Coqui STT ``.scorer`` packages: a KenLM binary with their vocabulary appended.

Layout (their ``native_client/ctcdecode/scorer.cpp``): a KenLM binary built without
its vocabulary strings (``build_binary -v``), then, where KenLM's search data end,
the int32 magic ``'TRIE'``, an int32 file version (6), a one-byte UTF-8-mode flag, the
default ``alpha`` and ``beta`` as doubles, and the vocabulary as an OpenFST
``ConstFst`` (standard arcs, aligned to 16 bytes): every word spelled as alphabet
indices + 1, ended by the space's index + 1, determinised and minimised.

KenLM (flashlight-text's, which this client's beam search uses) loads the package
itself, the trailing bytes being beyond what its headers describe; this module reads
the defaults and lists the words from the FST, so the lexicon beam search runs on the
package alone. The FST is read by hand because no Python package reads OpenFST's
binary format without OpenFST itself. The trie is the file's tail, so it is found by
its magic nearest the end whose FST ends exactly at the end of the file.

DeepSpeech's decoder weighs the LM's natural-log probabilities by ``alpha``; flashlight
weighs KenLM's log10 scores: the package's ``alpha`` is multiplied by ln 10 for it
(``lm_alpha``); ``beta`` (per word) is the same in both.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from native_client.alphabet import Alphabet

MAGIC = b"EIRT"  # the C++ multi-character constant 'TRIE' as a little-endian int32
FILE_VERSION = 6
FST_MAGIC = 2125659606
FST_ALIGNED = 4  # FstHeader flag: states and arcs start at 16-byte offsets
STATE = np.dtype(
    [("final", "<f4"), ("pos", "<u4"), ("narcs", "<u4"), ("niepsilons", "<u4"), ("noepsilons", "<u4")]
)
ARC = np.dtype([("ilabel", "<i4"), ("olabel", "<i4"), ("weight", "<f4"), ("next", "<i4")])
# The most a package's vocabulary may spell (DeepSpeech's and Coqui's keep 500,000 words): a DAG of a few
# hundred states can spell 2**100 words, so the words are counted before they are listed.
MAX_WORDS = 5_000_000
MAX_CHARACTERS = 100_000_000


class ScorerPackageError(ValueError):
    """A file that is not a scorer package this client can use; the message names it and says why."""


@dataclass(frozen=True)
class ScorerPackage:
    """A scorer package's defaults (DeepSpeech's alpha, beta) and its vocabulary."""

    path: Path
    alpha: float
    beta: float
    words: tuple[str, ...]

    @property
    def lm_alpha(self) -> float:
        """``alpha`` for this client's beam search, which weighs log10 LM scores (see the module doc)."""
        return self.alpha * math.log(10)


def _string(data: bytes, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<i", data, offset)
    if not 0 <= length <= 64:  # OpenFST's type names are short; a negative one would read backwards
        raise struct.error(f"type name of {length} bytes")
    return data[offset + 4 : offset + 4 + length].decode("ascii", "replace"), offset + 4 + length


def _aligned(offset: int) -> int:
    return (offset + 15) // 16 * 16


def _trie(data: bytes, start: int):
    """(utf8, alpha, beta, start state, states, arcs) of the trie at ``start``, or None if it is not one
    that ends exactly at the end of ``data``."""
    try:
        version, utf8 = struct.unpack_from("<ib", data, start + 4)
        alpha, beta = struct.unpack_from("<dd", data, start + 9)
        offset = start + 25
        (magic,) = struct.unpack_from("<i", data, offset)
        fst_type, offset = _string(data, offset + 4)
        arc_type, offset = _string(data, offset)
        _, flags, _, first, n_states, n_arcs = struct.unpack_from("<iiQqqq", data, offset)
    except struct.error:
        return None
    if version != FILE_VERSION or magic != FST_MAGIC or (fst_type, arc_type) != ("const", "standard"):
        return None
    if n_states < 1 or n_arcs < 0:
        return None
    offset += 40
    align = _aligned if flags & FST_ALIGNED else (lambda o: o)
    states_at = align(offset)
    arcs_at = align(states_at + n_states * STATE.itemsize)
    if arcs_at + n_arcs * ARC.itemsize != len(data) or not 0 <= first < n_states:
        return None
    states = np.frombuffer(data, STATE, n_states, states_at)
    arcs = np.frombuffer(data, ARC, n_arcs, arcs_at)
    return bool(utf8), alpha, beta, first, states, arcs


def is_scorer_package(path: str | Path) -> bool:
    """True for a KenLM binary with DeepSpeech's trie appended (reads the file's tail only when the
    head is a KenLM binary)."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as handle:
        if not handle.read(64).startswith(b"mmap lm "):
            return False
        return MAGIC in handle.read()


def read_scorer_package(path: str | Path, alphabet: Alphabet) -> ScorerPackage:
    """The defaults and words of the scorer package ``path``, its FST labels read through ``alphabet`` (the
    model's: a package is built for one alphabet). Raises ScorerPackageError naming the file.

    A package is a file people download: whatever its bytes, reading it takes time and memory bounded by
    its size and ``MAX_WORDS``/``MAX_CHARACTERS`` (see ``_vocabulary``)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ScorerPackageError(f"{path}: cannot read it: {error.strerror or error}") from None
    found, at = None, len(data)
    while found is None:
        at = data.rfind(MAGIC, 0, at)
        if at < 0:
            raise ScorerPackageError(
                f"{path}: no DeepSpeech vocabulary trie (version {FILE_VERSION}) at its end; "
                f"not a .scorer package of DeepSpeech 0.7+/Coqui STT"
            )
        found = _trie(data, at)
    utf8, alpha, beta, first, states, arcs = found
    if utf8:
        raise ScorerPackageError(
            f"{path}: built in UTF-8 (bytes output) mode, which this client does not support"
        )
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not math.isfinite(value):
            raise ScorerPackageError(f"{path}: its default {name} is {value}, not a finite number")
    if " " not in alphabet.labels:
        raise ScorerPackageError(f"{path}: the model's alphabet has no space to end words with")
    words = _vocabulary(path, states, arcs, first, alphabet)
    return ScorerPackage(path, float(alpha), float(beta), tuple(sorted(words)))


def _vocabulary(
    path: Path, states: np.ndarray, arcs: np.ndarray, first: int, alphabet: Alphabet
) -> list[str]:
    """The words the vocabulary FST spells from state ``first``, after checking that it is one: OpenFST's
    ConstFst layout (each state's arcs follow the previous state's), every arc to a state of the FST,
    every label in the alphabet, no cycle, and at most ``MAX_WORDS`` words of ``MAX_CHARACTERS`` in all.

    Counting first (over the states in topological order) bounds the walk: it follows only arcs that lead
    to a word, so its work is the length of the words it returns, however the FST is shaped."""
    n_states = len(states)
    counts = states["narcs"].astype(np.int64)
    ends = np.cumsum(counts)
    starts = ends - counts
    wrong = np.flatnonzero(states["pos"].astype(np.int64) != starts)
    if wrong.size:
        state = int(wrong[0])
        raise ScorerPackageError(
            f"{path}: vocabulary FST state {state}: its arcs start at {int(states['pos'][state])}, where the "
            f"previous state's end ({int(starts[state])}); not an OpenFST ConstFst"
        )
    if n_states and int(ends[-1]) != len(arcs):
        raise ScorerPackageError(
            f"{path}: the vocabulary FST's states have {int(ends[-1])} arcs, its header says {len(arcs)}"
        )
    targets = arcs["next"].astype(np.int64)
    outside = np.flatnonzero((targets < 0) | (targets >= n_states))
    if outside.size:
        arc = int(outside[0])
        state = int(np.searchsorted(ends, arc, side="right"))
        raise ScorerPackageError(
            f"{path}: vocabulary FST state {state} has an arc to state {int(targets[arc])}, outside its "
            f"{n_states} states"
        )
    labels = arcs["ilabel"].astype(np.int64)
    space = alphabet.labels.index(" ") + 1
    foreign = np.flatnonzero((labels < 1) | (labels > alphabet.size))
    if foreign.size:
        label = int(labels[foreign[0]])
        raise ScorerPackageError(
            f"{path}: its vocabulary uses label {label}, beyond the model's alphabet "
            f"of {alphabet.size}: a package built for another alphabet"
        )
    order = _topological_order(targets, starts, counts)
    if len(order) < n_states:
        raise ScorerPackageError(
            f"{path}: its vocabulary FST has a cycle ({n_states - len(order)} states on or after one); "
            f"a vocabulary FST is acyclic"
        )
    target_list, label_list = targets.tolist(), labels.tolist()
    # Words spelled from each state, and their characters, capped just past the limits (ints stay small).
    words_from, chars_from = [0] * n_states, [0] * n_states
    for state in reversed(order):
        words = chars = 0
        for arc in range(int(starts[state]), int(ends[state])):
            if label_list[arc] == space:
                words += 1
            else:
                after = target_list[arc]
                words += words_from[after]
                chars += chars_from[after] + words_from[after]
        words_from[state], chars_from[state] = min(words, MAX_WORDS + 1), min(chars, MAX_CHARACTERS + 1)
    if words_from[first] > MAX_WORDS or chars_from[first] > MAX_CHARACTERS:
        raise ScorerPackageError(
            f"{path}: its vocabulary FST spells more than {MAX_WORDS:,} words or {MAX_CHARACTERS:,} "
            f"characters, beyond what this client reads"
        )
    found, stack = [], [(first, "")]
    while stack:
        state, prefix = stack.pop()
        for arc in range(int(starts[state]), int(ends[state])):
            label, after = label_list[arc], target_list[arc]
            if label == space:
                found.append(prefix)
            elif words_from[after]:
                stack.append((after, prefix + alphabet.labels[label - 1]))
    return found


def _topological_order(targets: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> list[int]:
    """The states in an order where every arc goes forward (Kahn's algorithm); shorter than the number of
    states when the graph has a cycle."""
    n_states = len(starts)
    waiting = np.bincount(targets, minlength=n_states).tolist()
    target_list, start_list, count_list = targets.tolist(), starts.tolist(), counts.tolist()
    order = [state for state in range(n_states) if waiting[state] == 0]
    index = 0
    while index < len(order):
        state = order[index]
        index += 1
        for after in target_list[start_list[state] : start_list[state] + count_list[state]]:
            waiting[after] -= 1
            if waiting[after] == 0:
                order.append(after)
    return order
