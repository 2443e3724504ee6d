"""The model's labels: the UTF-8 bytes, a hand-written alphabet, or the Alphabet stage's, checked against
its report. Every stage that builds or reads a model loads them here."""

from __future__ import annotations

import hashlib
from pathlib import Path

from native_client.alphabet import Alphabet, ByteAlphabet, Labels, load_alphabet
from pipeline.config import Config
from pipeline.reports import AlphabetReport, ReportError, read_report
from pipeline.workdir import AlphabetFiles


def alphabet_intact(files: AlphabetFiles) -> bool:
    """Whether ``files`` holds a finished alphabet whose file has the digest its report recorded."""
    try:
        _verified(files)
    except ReportError:
        return False
    return True


def _verified(files: AlphabetFiles) -> Alphabet:
    """The alphabet of ``files``, checked against its report; ReportError naming the file otherwise."""
    report = read_report(files.report, AlphabetReport)
    try:
        data = files.alphabet.read_bytes()
    except OSError as error:
        raise ReportError(
            f"{files.alphabet}: cannot read the built alphabet ({error.strerror}); "
            f"run `make rerun STAGE=Alphabet`"
        ) from None
    if hashlib.sha256(data).hexdigest() != report.sha256:
        raise ReportError(
            f"{files.alphabet}: its SHA-256 differs from the one {files.report.name} recorded (edited or "
            f"damaged); run `make rerun STAGE=Alphabet`"
        )
    return load_alphabet(files.alphabet)


def model_alphabet(config: Config, alphabet: Path) -> Labels:
    """The model's labels for ``config``: the UTF-8 bytes (``model.output: bytes``), else the alphabet file
    ``alphabet`` (``Layout.alphabet``), checked against its report when the Alphabet stage built it
    (``paths.alphabet: auto``)."""
    if config.model.output == "bytes":
        return ByteAlphabet()
    if config.alphabet_auto:
        return _verified(AlphabetFiles(Path(alphabet).parent))
    return load_alphabet(alphabet)
