"""KenLM's own command-line tools: ``lmplz`` (estimation with a disk-backed sort), ``filter`` (vocabulary
limit) and ``build_binary`` (a trie that loads in a fraction of an ARPA's time).

``make kenlm`` compiles them from the pinned ``kenlm`` source distribution into
the virtualenv's ``bin``; they are looked up there first, then on ``PATH``.
Text is streamed into ``lmplz`` line by line, never held in memory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

TOOLS = ("lmplz", "build_binary", "filter")
# What a run that must use them (``decoder.lm_builder: kenlm``) says where they are not found.
TOOLS_MISSING = (
    "decoder.lm_builder is kenlm but KenLM's lmplz, build_binary and filter are not installed (beside "
    "this Python or on PATH): run `make kenlm`, or set decoder.lm_builder: auto or python"
)


class KenLMToolError(RuntimeError):
    """A KenLM tool is missing or failed; the message names the command and its last output lines."""


def find_tools() -> dict[str, Path] | None:
    """Paths of ``lmplz``, ``build_binary`` and ``filter`` (beside this Python first, then on PATH), or None
    when any is missing."""
    here = Path(sys.executable).parent
    found = {}
    for name in TOOLS:
        local = here / name
        path = local if local.is_file() and os.access(local, os.X_OK) else shutil.which(name)
        if not path:
            return None
        found[name] = Path(path)
    return found


def _failed(command: list, log: Path, code: int) -> KenLMToolError:
    tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:]) if log.exists() else ""
    return KenLMToolError(f"{Path(command[0]).name} exited with status {code} ({tail}); full output in {log}")


def run_lmplz(
    lmplz: Path,
    lines: Iterable[str],
    arpa: Path,
    order: int,
    memory: str,
    temp_dir: Path,
    prune: tuple[int, ...],
    log: Path,
) -> None:
    """Estimate an order-``order`` modified Kneser-Ney model of ``lines`` (fed to lmplz's stdin one by one)
    into ``arpa``; ``memory`` is lmplz's ``-S`` (e.g. ``2G`` or ``50%``), its sort spills to ``temp_dir``.
    ``--discount_fallback`` lets it estimate from too few counts as the Python estimator does."""
    temp_dir.mkdir(parents=True, exist_ok=True)
    command = [
        str(lmplz),
        "-o",
        str(order),
        "-S",
        memory,
        "-T",
        str(temp_dir),
        "--arpa",
        str(arpa),
        "--discount_fallback",
    ]
    if prune:
        command += ["--prune", *(str(p) for p in prune)]
    with open(log, "ab") as output:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=output, stderr=output)
        try:
            for line in lines:
                process.stdin.write(line.encode("utf-8") + b"\n")
            process.stdin.close()
        except BrokenPipeError:
            pass  # lmplz stopped reading: its status and log say why
        except BaseException:
            process.kill()
            process.wait()
            raise
        code = process.wait()
    if code != 0:
        raise _failed(command, log, code)


def filter_vocabulary(filter_tool: Path, arpa: Path, vocabulary: Iterable[str], out: Path, log: Path) -> None:
    """Keep only the n-grams of ``arpa`` made of ``vocabulary`` words (DeepSpeech's top-k limit)."""
    command = [str(filter_tool), "single", f"model:{arpa}", str(out)]
    with open(log, "ab") as output:
        result = subprocess.run(
            command, input="\n".join(vocabulary).encode("utf-8"), stdout=output, stderr=output
        )
    if result.returncode != 0:
        raise _failed(command, log, result.returncode)


def build_binary(build_binary_tool: Path, arpa: Path, binary: Path, quantize_bits: int, log: Path) -> None:
    """A trie binary of ``arpa``; ``quantize_bits`` (1-8, 0 = none) quantises probabilities and backoffs
    and compresses pointers, as DeepSpeech's scorer did (``-a 255 -q 8``)."""
    command = [str(build_binary_tool)]
    if quantize_bits:
        command += ["-a", "255", "-q", str(quantize_bits)]
    command += ["trie", str(arpa), str(binary)]
    with open(log, "ab") as output:
        result = subprocess.run(command, stdout=output, stderr=output)
    if result.returncode != 0:
        raise _failed(command, log, result.returncode)
