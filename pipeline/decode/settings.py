"""Beam search with the LanguageModel stage's output: settings (tuned when tuning is on) and decoders."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from native_client.alphabet import Alphabet
from native_client.beam import BeamDecoder, BeamSettings
from pipeline.config import Config
from pipeline.decode.pool import DecodePool
from pipeline.evaluation.metrics import SampleResult, score_sample
from pipeline.layout import Layout
from pipeline.lm.files import read_lm_report
from pipeline.reports import TuneReport, read_report


def tuned_values(layout: Layout) -> dict | None:
    """``{"lm_alpha", "lm_beta"}`` from TuneDecoder when ``decoder.tune`` is on; None otherwise."""
    if not layout.config.decoder.tune:
        return None
    best = read_report(layout.tune_report, TuneReport).best
    return {"lm_alpha": best.lm_alpha, "lm_beta": best.lm_beta}


def configured_settings(config: Config) -> BeamSettings:
    """Beam settings exactly as the config writes them (no tuning)."""
    decoder = config.decoder
    return BeamSettings(
        beam_width=decoder.beam_width,
        beam_threshold=decoder.beam_threshold,
        beam_size_token=decoder.beam_size_token,
        lm_alpha=decoder.lm_alpha,
        lm_beta=decoder.lm_beta,
        lexicon=decoder.lexicon,
    )


def beam_settings(layout: Layout) -> BeamSettings:
    """Beam settings of the config, with TuneDecoder's alpha and beta when ``decoder.tune`` is on."""
    tuned = tuned_values(layout)
    settings = configured_settings(layout.config)
    return dataclasses.replace(settings, **tuned) if tuned else settings


def lm_paths(layout: Layout) -> tuple[Path, Path]:
    """(the LM the decoder uses, the vocabulary) from the LanguageModel stage's report."""
    report = read_lm_report(layout)
    return layout.lm.resolve(
        report.lm if layout.config.decoder.lexicon else report.char_lm
    ), layout.lm.vocabulary


def _vocabulary(layout: Layout, vocab: Path) -> list[str] | None:
    return vocab.read_text(encoding="utf-8").split() if layout.config.decoder.lexicon else None


def make_beam_decoder(
    layout: Layout, alphabet: Alphabet, settings: BeamSettings | None = None
) -> BeamDecoder:
    """A beam decoder over the LanguageModel stage's LM with ``settings`` (default: ``beam_settings``)."""
    lm, vocab = lm_paths(layout)
    return BeamDecoder(alphabet, lm, settings or beam_settings(layout), _vocabulary(layout, vocab))


def decode_pool(layout: Layout, alphabet: Alphabet, settings: BeamSettings | None = None) -> DecodePool:
    """``decoder.workers`` processes decoding with the LanguageModel stage's LM (see ``DecodePool``)."""
    lm, vocab = lm_paths(layout)
    return DecodePool(
        alphabet,
        lm,
        settings or beam_settings(layout),
        _vocabulary(layout, vocab),
        workers=layout.config.decoder.workers,
    )


def rescore(greedy: list[SampleResult], texts: list[str]) -> list[SampleResult]:
    """``greedy`` results (references, losses) scored against other transcripts of the same utterances."""
    return [score_sample(r.path, r.reference, text, r.loss) for r, text in zip(greedy, texts, strict=True)]
