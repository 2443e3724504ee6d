"""DeepSpeech ``.scorer`` packages for tests: a KenLM binary (or a stand-in for its head) with the vocabulary
trie appended, laid out as DeepSpeech's generate_scorer_package writes it."""

from __future__ import annotations

import struct
from pathlib import Path

# What the reader looks at of a KenLM binary: its first bytes (the rest is KenLM's, never read by it).
KENLM_HEAD = b"mmap lm http://kheafield.com/code format version 5\n\0" + bytes(range(256)) * 4


def write_scorer_package(
    binary: Path, words: list[str], alphabet, alpha: float, beta: float, out: Path
) -> None:
    """A .scorer package laid out as DeepSpeech's generate_scorer_package writes one (trie not minimised)."""
    out.write_bytes(package_bytes(words, alphabet, alpha, beta, binary.read_bytes()))


def package_bytes(
    words: list[str], alphabet, alpha: float = 0.75, beta: float = 1.25, head: bytes = KENLM_HEAD
) -> bytes:
    """The bytes of a package: ``head`` (a KenLM binary; by default only what the vocabulary reader looks
    at) and the trie of ``words`` spelled in ``alphabet``, with the defaults ``alpha`` and ``beta``."""
    children: list[dict] = [{}]
    final = {0: False}
    space = alphabet.labels.index(" ") + 1
    for word in words:
        state = 0
        for label in [alphabet.labels.index(ch) + 1 for ch in word] + [space]:
            if label not in children[state]:
                children.append({})
                children[state][label] = len(children) - 1
            state = children[state][label]
        final[state] = True
    return fst_package([sorted(arcs_of.items()) for arcs_of in children], alpha, beta, head, final)


def fst_package(
    states_arcs: list[list[tuple[int, int]]],
    alpha: float = 0.75,
    beta: float = 1.25,
    head: bytes = KENLM_HEAD,
    final: dict[int, bool] | None = None,
) -> bytes:
    """A package whose vocabulary FST has, for each state, the arcs ``(label, next state)`` given (the
    start state is 0; ``final``: the states that are final)."""
    states, arcs = b"", b""
    for state, arcs_of in enumerate(states_arcs):
        weight = 0.0 if (final or {}).get(state) else float("inf")
        states += struct.pack("<fIIII", weight, len(arcs) // 16, len(arcs_of), 0, len(arcs_of))
        arcs += b"".join(struct.pack("<iifi", label, label, 0.0, nxt) for label, nxt in arcs_of)
    data = bytearray(head)
    data += b"EIRT" + struct.pack("<ib", 6, 0) + struct.pack("<dd", alpha, beta)
    data += (
        struct.pack("<i", 2125659606) + struct.pack("<i", 5) + b"const" + struct.pack("<i", 8) + b"standard"
    )
    data += struct.pack("<iiQqqq", 2, 4, 0, 0, len(states_arcs), len(arcs) // 16)
    data += b"\0" * (-len(data) % 16) + states
    data += b"\0" * (-len(data) % 16) + arcs
    return bytes(data)


def trie_layout(data: bytes) -> dict[str, int]:
    """Offsets in a package from ``package_bytes``: ``alpha``, ``beta``, the FST header's ``first``,
    ``n_states``, ``n_arcs``, and where the ``states`` (20 bytes each) and ``arcs`` (16 bytes each) start."""
    start = data.rfind(b"EIRT")
    header = start + 25 + 4 + 4 + len(b"const") + 4 + len(b"standard")
    n_states, n_arcs = struct.unpack_from("<qq", data, header + 24)
    states = -(-(header + 40) // 16) * 16
    return {
        "alpha": start + 9,
        "beta": start + 17,
        "first": header + 16,
        "n_states": n_states,
        "n_arcs": n_arcs,
        "states": states,
        "arcs": -(-(states + 20 * n_states) // 16) * 16,
    }
