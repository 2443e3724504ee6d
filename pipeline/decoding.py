"""Beam search with the LanguageModel stage's output: settings (tuned when tuning is on) and decoders."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from native_client.alphabet import Alphabet
from native_client.beam import BeamDecoder, BeamSettings
from pipeline.config import Config
from pipeline.decode_pool import DecodePool
from pipeline.layout import Layout, file_digest
from pipeline.metrics import SampleResult, score_sample
from pipeline.reports import LMReport, TuneReport, read_report


class LanguageModelDamaged(RuntimeError):
    """A file the LanguageModel stage wrote was changed, truncated or removed since."""


def lm_built(layout: Layout) -> bool:
    """Whether the LanguageModel stage of this config has finished (its report exists)."""
    return layout.lm.report.is_file()


def lm_file_records(directory: Path, names) -> dict:
    """{name: size, modification time and SHA-256} of the stage files ``names`` in ``directory``."""
    records = {}
    for name in names:
        stat = (directory / name).stat()
        records[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_digest(directory / name)}
    return records


def verify_lm_files(layout: Layout, deep: bool) -> None:
    """Check the LanguageModel stage's files against its report: size and modification time (cheap,
    for ``complete()``), and with ``deep`` their SHA-256 too (before a stage reads them). Raises
    LanguageModelDamaged naming the first file that differs."""
    report = read_lm_report(layout)
    for name, record in (report.files or {}).items():
        path = layout.lm.root / name
        redo = "make rerun STAGE=LanguageModel (or delete the directory) to build it again"
        try:
            stat = path.stat()
        except OSError:
            raise LanguageModelDamaged(f"{path}: missing; {redo}") from None
        if stat.st_size != record["size"]:
            raise LanguageModelDamaged(f"{path}: {stat.st_size} bytes, the LM report says {record['size']}; {redo}")
        if stat.st_mtime_ns != record["mtime_ns"] and not deep:
            raise LanguageModelDamaged(f"{path}: modified after the LanguageModel stage wrote it; {redo}")
        if deep and file_digest(path) != record["sha256"]:
            raise LanguageModelDamaged(f"{path}: its SHA-256 differs from the LM report's; {redo}")


def read_lm_report(layout: Layout) -> LMReport:
    """The LanguageModel report of this config (ReportError naming the file when missing or damaged)."""
    return read_report(layout.lm.report, LMReport)


def tuned_values(layout: Layout) -> Optional[dict]:
    """``{"lm_alpha", "lm_beta"}`` from TuneDecoder when ``decoder.tune`` is on; None otherwise."""
    if not layout.config.decoder.tune:
        return None
    best = read_report(layout.tune_report, TuneReport).best
    return {"lm_alpha": best.lm_alpha, "lm_beta": best.lm_beta}


def configured_settings(config: Config) -> BeamSettings:
    """Beam settings exactly as the config writes them (no tuning)."""
    decoder = config.decoder
    return BeamSettings(beam_width=decoder.beam_width, beam_threshold=decoder.beam_threshold,
                        beam_size_token=decoder.beam_size_token, lm_alpha=decoder.lm_alpha, lm_beta=decoder.lm_beta,
                        lexicon=decoder.lexicon)


def beam_settings(layout: Layout) -> BeamSettings:
    """Beam settings of the config, with TuneDecoder's alpha and beta when ``decoder.tune`` is on."""
    tuned = tuned_values(layout)
    settings = configured_settings(layout.config)
    return dataclasses.replace(settings, **tuned) if tuned else settings


def lm_paths(layout: Layout) -> tuple[Path, Path]:
    """(the LM the decoder uses, the vocabulary) from the LanguageModel stage's report."""
    report = read_lm_report(layout)
    return layout.lm.resolve(report.lm if layout.config.decoder.lexicon else report.char_lm), layout.lm.vocabulary


def _vocabulary(layout: Layout, vocab: Path) -> Optional[list[str]]:
    return vocab.read_text(encoding="utf-8").split() if layout.config.decoder.lexicon else None


def make_beam_decoder(layout: Layout, alphabet: Alphabet, settings: Optional[BeamSettings] = None) -> BeamDecoder:
    """A beam decoder over the LanguageModel stage's LM with ``settings`` (default: ``beam_settings``)."""
    lm, vocab = lm_paths(layout)
    return BeamDecoder(alphabet, lm, settings or beam_settings(layout), _vocabulary(layout, vocab))


def decode_pool(layout: Layout, alphabet: Alphabet, settings: Optional[BeamSettings] = None) -> DecodePool:
    """``decoder.workers`` processes decoding with the LanguageModel stage's LM (see ``DecodePool``)."""
    lm, vocab = lm_paths(layout)
    return DecodePool(alphabet, lm, settings or beam_settings(layout), _vocabulary(layout, vocab),
                      workers=layout.config.decoder.workers)


def rescore(greedy: list[SampleResult], texts: list[str]) -> list[SampleResult]:
    """``greedy`` results (references, losses) scored against other transcripts of the same utterances."""
    return [score_sample(r.path, r.reference, text, r.loss) for r, text in zip(greedy, texts, strict=True)]
