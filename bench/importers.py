"""Import benchmark: files per second and peak RSS of importing a synthetic LibriSpeech tree at two sizes.

    .venv/bin/python bench/importers.py [--sizes 25000 100000] [--cache-dir DIR]

The tree is made once into ``--cache-dir`` (default ``~/.cache/luigi-deepspeech-bench/importers``,
outside the repository) and reused: ``LibriSpeech/train-clean-100`` holds the smaller size's FLAC files
and ``train-clean-360`` the rest of the larger size, 100 utterances per chapter and 10 chapters per
speaker, with a ``.trans.txt`` per chapter as the release has. Every FLAC file is the same bytes (a
valid 0.2 s FLAC, written once by soundfile and copied), so making 100,000 files takes seconds; the
import reads each one's header all the same. Importing the smaller size means the parts
``[train-clean-100]``, the larger ``[train-clean-100, train-clean-360]``.

Each size runs in its own child process (its peak RSS is the child's ``ru_maxrss``): the corpus listing
that fingerprints an Import (a ``stat`` per file: what ``complete()`` costs once per process) and then
the import itself (every transcript line normalised, every FLAC header read, the manifests, rejects and
report written). Memory should be flat in the corpus size and time linear: the JSON carries the ratios.
Prints the CPU (model, AVX2/AVX-512, caches) with the figures; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measured_child import run_measured

ROOT = Path(__file__).resolve().parent.parent
PER_CHAPTER, CHAPTERS_PER_SPEAKER = 100, 10
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards box and quietly hum".split()


def _flac_blob() -> bytes:
    """A small valid FLAC file (0.2 s of a quiet tone at 16 kHz) as bytes."""
    import numpy as np
    import soundfile

    t = np.arange(3200) / 16000
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000, format="FLAC")
    return buffer.getvalue()


def _write_part(part: Path, first: int, count: int, blob: bytes) -> None:
    """``count`` utterances numbered from ``first``, LibriSpeech-style, into ``part``."""
    for start in range(first, first + count, PER_CHAPTER):
        chapter_index = start // PER_CHAPTER
        speaker = f"{1000 + chapter_index // CHAPTERS_PER_SPEAKER}"
        chapter = f"{100000 + chapter_index}"
        folder = part / speaker / chapter
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for index in range(min(PER_CHAPTER, first + count - start)):
            ident = f"{speaker}-{chapter}-{index:04d}"
            with open(folder / f"{ident}.flac", "wb") as handle:
                handle.write(blob)
            words = [WORDS[(start + index + k) % len(WORDS)] for k in range(6)]
            lines.append(f"{ident} {' '.join(words).upper()}\n")
        (folder / f"{speaker}-{chapter}.trans.txt").write_text("".join(lines))


def make_tree(cache_dir: Path, small: int, large: int) -> Path:
    """The synthetic tree for the two sizes (made once; a ``.done`` marker names what it holds)."""
    root = cache_dir / f"librispeech-{small}-{large}"
    if (root / ".done").is_file():
        return root
    shutil.rmtree(root, ignore_errors=True)
    started = time.perf_counter()
    blob = _flac_blob()
    _write_part(root / "LibriSpeech" / "train-clean-100", 0, small, blob)
    _write_part(root / "LibriSpeech" / "train-clean-360", small, large - small, blob)
    (root / ".done").write_text(f"{small} {large}\n")
    print(
        f"made {large} FLAC files in {root} in {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return root


def child(root: Path, parts: list[str], out: Path) -> dict:
    """In the child: list (fingerprint) and import ``parts``; returns the counts and timings."""
    from pipeline.data.importing import CorpusSpec, corpus_listing, import_corpus, plan_import

    plan = plan_import(CorpusSpec("librispeech", root, splits={"train": tuple(parts), "dev": (), "test": ()}))
    started = time.perf_counter()
    listing = corpus_listing(plan.importer, plan.root, tuple(plan.parts), plan.options)
    listed = time.perf_counter() - started
    started = time.perf_counter()
    report = import_corpus(plan, out)
    imported = time.perf_counter() - started
    return {
        "listed_files": listing.files,
        "listing_s": round(listed, 3),
        "rows": report["rows"],
        "kept": report["kept"],
        "import_s": round(imported, 3),
    }


def cpu() -> str:
    """The CPU a figure came from: model, AVX2/AVX-512, and the cache sizes (``lscpu``)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    flags = set(fields.get("Flags", "").split())
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    caches = ", ".join(f"{k} {fields[k]}" for k in ("L1d cache", "L2 cache", "L3 cache") if k in fields)
    return f"{fields.get('Model name', 'unknown')}, {os.cpu_count()} cores, {vector}, {caches}"


def main(argv=None) -> int:
    """Make (or reuse) the tree, measure each size in a child process, print the figures and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[25_000, 100_000], metavar=("SMALL", "LARGE"))
    parser.add_argument(
        "--cache-dir", type=Path, default=Path.home() / ".cache" / "luigi-deepspeech-bench" / "importers"
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--parts", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.parts.split(","), args.out)), flush=True)
        return 0

    small, large = sorted(args.sizes)
    root = make_tree(args.cache_dir, small, large)
    machine = cpu()
    print(f"CPU: {machine}", file=sys.stderr)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    sizes = []
    for count, parts in ((small, ["train-clean-100"]), (large, ["train-clean-100", "train-clean-360"])):
        out = Path(tempfile.mkdtemp(prefix="import-", dir=args.cache_dir))
        try:
            arguments = [__file__, "--child", str(root), "--parts", ",".join(parts), "--out", str(out)]
            result, rss = run_measured(arguments, env=env)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        assert result["kept"] == count, result
        figures = {
            "files": count,
            "import_files_per_s": round(count / result["import_s"], 1),
            "listing_files_per_s": round(result["listed_files"] / result["listing_s"], 1),
            "peak_rss_mib": round(rss, 1),
            **result,
        }
        sizes.append(figures)
        print(
            f"{count} files: import {figures['import_files_per_s']} files/s ({result['import_s']} s), "
            f"listing {figures['listing_files_per_s']} files/s ({result['listing_s']} s), "
            f"peak RSS {rss:.0f} MiB",
            file=sys.stderr,
            flush=True,
        )
    print(f"CPU: {machine}")
    print(
        json.dumps(
            {
                "cpu": machine,
                "sizes": sizes,
                "files_ratio": round(large / small, 3),
                "import_time_ratio": round(sizes[1]["import_s"] / sizes[0]["import_s"], 3),
                "rss_ratio": round(sizes[1]["peak_rss_mib"] / sizes[0]["peak_rss_mib"], 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    sys.exit(main())
