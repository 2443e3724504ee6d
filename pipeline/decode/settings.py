"""The configured decoder over the LanguageModel stage's output: its settings (tuned when tuning is on),
its ``DecoderSpec``, and the pool that decodes with it."""

from __future__ import annotations

from pathlib import Path

from native_client.alphabet import Labels
from native_client.decoders import DecoderSpec
from pipeline.config import Config
from pipeline.decode.pool import DecodePool
from pipeline.evaluation.metrics import SampleResult, score_sample
from pipeline.lm.files import read_lm_report
from pipeline.reports import TuneReport, read_report
from pipeline.workdir import LMFiles

# The decoder config keys a decoder is built with (DecoderSpec.settings, the export's ``decoder`` entry).
SEARCH_KEYS = ("beam_width", "beam_threshold", "beam_size_token", "lm_alpha", "lm_beta", "lexicon")


def tuned_values(config: Config, tune_report: Path) -> dict | None:
    """``{"lm_alpha", "lm_beta"}`` from TuneDecoder's ``tune_report`` when ``decoder.tune`` is on; None
    otherwise."""
    if not config.decoder.tune:
        return None
    best = read_report(tune_report, TuneReport).best
    return {"lm_alpha": best.lm_alpha, "lm_beta": best.lm_beta}


def configured_settings(config: Config) -> dict:
    """The decoder's settings exactly as the config writes them (no tuning)."""
    return {key: getattr(config.decoder, key) for key in SEARCH_KEYS}


def decoder_settings(config: Config, tune_report: Path) -> dict:
    """The decoder's settings, with TuneDecoder's alpha and beta (from ``tune_report``) when
    ``decoder.tune`` is on."""
    return {**configured_settings(config), **(tuned_values(config, tune_report) or {})}


def decoder_spec(config: Config, lm: LMFiles, alphabet: Labels, settings: dict) -> DecoderSpec:
    """``decoder.type`` over the LanguageModel stage's LM in ``lm`` (the word LM and its vocabulary with a
    lexicon, the character LM without), with ``settings`` (``decoder_settings`` or a trial's)."""
    settings = dict(settings)
    report = read_lm_report(lm)
    lexicon = settings["lexicon"]
    return DecoderSpec(
        type=config.decoder.type,
        labels=tuple(getattr(alphabet, "labels", ())),
        output=alphabet.output,
        lm=str(lm.resolve(report.lm if lexicon else report.char_lm)),
        vocabulary=str(lm.vocabulary) if lexicon else None,
        settings=settings,
    )


def decode_pool(config: Config, spec: DecoderSpec) -> DecodePool:
    """``decoder.workers`` processes decoding with the decoder ``spec`` describes (see ``DecodePool``)."""
    return DecodePool(spec, workers=config.decoder.workers)


def describe(spec: DecoderSpec) -> str:
    """A short label of the decoder for reports: ``beam 256 + LM, alpha 1.50, beta 2.25``."""
    settings = spec.settings
    weights = f"alpha {settings['lm_alpha']:.2f}, beta {settings['lm_beta']:.2f}"
    if spec.type == "beam":
        return f"beam {settings['beam_width']} + LM, {weights}"
    return f"decoder {spec.type}, {weights}"


def rescore(greedy: list[SampleResult], texts: list[str]) -> list[SampleResult]:
    """``greedy`` results (references, losses) scored against other transcripts of the same utterances."""
    return [score_sample(r.path, r.reference, text, r.loss) for r, text in zip(greedy, texts, strict=True)]
