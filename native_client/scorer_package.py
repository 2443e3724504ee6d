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
    offset += 40
    align = _aligned if flags & FST_ALIGNED else (lambda o: o)
    states_at = align(offset)
    arcs_at = align(states_at + n_states * STATE.itemsize)
    if arcs_at + n_arcs * ARC.itemsize != len(data) or not 0 <= first < max(n_states, 1):
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
    model's: a package is built for one alphabet). Raises ScorerPackageError naming the file."""
    path = Path(path)
    data = path.read_bytes()
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
    if " " not in alphabet.labels:
        raise ScorerPackageError(f"{path}: the model's alphabet has no space to end words with")
    space = alphabet.labels.index(" ") + 1
    words, stack = [], [(first, "")]
    while stack:
        state, prefix = stack.pop()
        record = states[state]
        for arc in arcs[record["pos"] : record["pos"] + record["narcs"]]:
            label = int(arc["ilabel"])
            if label == space:
                words.append(prefix)
            elif 1 <= label <= alphabet.size:
                stack.append((int(arc["next"]), prefix + alphabet.labels[label - 1]))
            else:
                raise ScorerPackageError(
                    f"{path}: its vocabulary uses label {label}, beyond the model's alphabet "
                    f"of {alphabet.size}: a package built for another alphabet"
                )
    return ScorerPackage(path, float(alpha), float(beta), tuple(sorted(words)))
