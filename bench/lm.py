"""LM benchmark: build time and peak RSS of KenLM's lmplz (+ build_binary) and of the Python \
estimator, and the
load time of an ARPA against a binary.

    .venv/bin/python bench/lm.py [--words 1 5 20] [--orders 3 5] [--memory 2G] [--cache-dir DIR]

Needs ``make kenlm``. LM texts of about 1, 5 and 20 million words are made
once into ``--cache-dir`` from ``data/sample/lm_corpus.txt``: copy k of the
corpus replaces a third of the word types (chosen by a hash of the word) by a
variant that changes every 4 copies, so the vocabulary and the n-gram counts
keep growing with the text instead of repeating it. Each build runs in its own
child process; its peak RSS is the child's ``ru_maxrss`` (lmplz included).
The Python estimator is skipped where its measured ~600 bytes per n-gram
would pass ``--python-limit-gb``. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from measured_child import run_measured

from pipeline.workdir import LMFiles

ROOT = Path(__file__).resolve().parent.parent
LETTERS = "abcdefghijklmnopqrstuvwxyz"
PYTHON_BYTES_PER_NGRAM = 600


def _variant(word: str, copy: int) -> str:
    digest = hashlib.blake2b(f"{word}/{copy // 4}".encode(), digest_size=4).digest()
    if hashlib.blake2b(word.encode(), digest_size=1).digest()[0] % 3 or copy == 0:
        return word
    return word + "".join(LETTERS[b % 26] for b in digest[:2])


def make_text(cache_dir: Path, million_words: float) -> Path:
    """An LM text of about ``million_words`` million words (made once, then reused)."""
    path = cache_dir / f"lm-text-{million_words:g}M.txt"
    if path.exists():
        return path
    lines = [
        line.split()
        for line in open(ROOT / "data" / "sample" / "lm_corpus.txt", encoding="utf-8")
        if line.strip()
    ]
    per_copy = sum(len(words) for words in lines)
    copies = max(1, round(million_words * 1e6 / per_copy))
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for copy in range(copies):
            table: dict[str, str] = {}
            for words in lines:
                out.write(" ".join(table.setdefault(w, _variant(w, copy)) for w in words) + "\n")
    os.replace(tmp, path)
    return path


def build_kenlm(text: Path, order: int, memory: str, work: Path) -> dict:
    """lmplz then build_binary (quantised as the pipeline's default); in a child process."""
    from pipeline.lm.kenlm_tools import build_binary, find_tools, run_lmplz

    tools = find_tools()
    files = LMFiles(work)
    arpa, binary, log = files.word_arpa, files.word_binary, files.build_log
    started = time.perf_counter()
    with open(text, encoding="utf-8") as lines:
        run_lmplz(
            tools["lmplz"], (line.rstrip("\n") for line in lines), arpa, order, memory, work / "sort", (), log
        )
    estimated = time.perf_counter()
    build_binary(tools["build_binary"], arpa, binary, 8, log)
    from native_client.arpa import arpa_counts

    return {
        "lmplz_s": estimated - started,
        "build_binary_s": time.perf_counter() - estimated,
        "ngrams": sum(arpa_counts(arpa).values()),
        "arpa_mb": arpa.stat().st_size / 1e6,
        "binary_mb": binary.stat().st_size / 1e6,
    }


def build_python(text: Path, order: int, memory: str, work: Path) -> dict:
    """The built-in estimator and its ARPA writer; in a child process."""
    from pipeline.lm.kneser_ney import estimate, write_arpa

    started = time.perf_counter()
    with open(text, encoding="utf-8") as lines:
        model = estimate((line.split() for line in lines), order)
    write_arpa(model, work / "python.arpa")
    return {"seconds": time.perf_counter() - started, "arpa_mb": (work / "python.arpa").stat().st_size / 1e6}


def load_times(work: Path) -> dict:
    """Seconds to load the ARPA and the binary of the same model with KenLM (the decoder's loader)."""
    import kenlm

    times = []
    for path in (LMFiles(work).word_arpa, LMFiles(work).word_binary):
        started = time.perf_counter()
        kenlm.Model(str(path))
        times.append(time.perf_counter() - started)
    return {"arpa_load_s": times[0], "binary_load_s": times[1]}


CHILDREN = {
    "kenlm": build_kenlm,
    "python": build_python,
    "load": lambda text, order, memory, work: load_times(work),
}


def child(kind: str, text: Path, order: int, memory: str, work: Path) -> tuple[dict, float]:
    """Run one measurement in a child process; (its result, its peak RSS in MiB)."""
    return run_measured(
        [
            __file__,
            "--child",
            kind,
            "--text",
            str(text),
            "--order",
            str(order),
            "--memory",
            memory,
            "--work",
            str(work),
        ]
    )


def main(argv=None) -> int:
    """Make (or reuse) the texts, build with both builders, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=float, nargs="+", default=[1, 5, 20], help="millions of words")
    parser.add_argument("--orders", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--memory", default="2G", help="lmplz -S")
    parser.add_argument("--python-limit-gb", type=float, default=12.0)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "luigi-deepspeech-bench")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--text", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--order", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child](args.text, args.order, args.memory, args.work)), flush=True)
        return 0

    from pipeline.lm.kenlm_tools import find_tools

    if find_tools() is None:
        print(
            "bench/lm.py needs KenLM's lmplz, build_binary and filter: run `make kenlm` first",
            file=sys.stderr,
        )
        return 2
    rows = []
    for words in args.words:
        text = make_text(args.cache_dir, words)
        count = sum(len(line.split()) for line in open(text, encoding="utf-8"))
        for order in args.orders:
            with tempfile.TemporaryDirectory(dir=args.cache_dir) as work:
                work = Path(work)
                kenlm, kenlm_rss = child("kenlm", text, order, args.memory, work)
                loads, _ = child("load", text, order, args.memory, work)
                row = {
                    "million_words": round(count / 1e6, 2),
                    "order": order,
                    "ngrams": kenlm["ngrams"],
                    "kenlm_s": round(kenlm["lmplz_s"] + kenlm["build_binary_s"], 1),
                    "kenlm_peak_rss_mb": round(kenlm_rss, 1),
                    "arpa_mb": round(kenlm["arpa_mb"], 1),
                    "binary_mb": round(kenlm["binary_mb"], 1),
                    "arpa_load_s": round(loads["arpa_load_s"], 2),
                    "binary_load_s": round(loads["binary_load_s"], 3),
                }
                if kenlm["ngrams"] * PYTHON_BYTES_PER_NGRAM / 1e9 <= args.python_limit_gb:
                    python, python_rss = child("python", text, order, args.memory, work)
                    row.update(python_s=round(python["seconds"], 1), python_peak_rss_mb=round(python_rss, 1))
                else:
                    row.update(python_s=None, python_peak_rss_mb=None)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"rows": rows, "memory": args.memory}))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    sys.exit(main())
