"""Beam search with the LanguageModel stage's output: settings (tuned when tuning is on) and decoders."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from native_client.alphabet import Alphabet
from native_client.beam import BeamDecoder, BeamSettings
from pipeline import layout
from pipeline.config import Config
from pipeline.lm import REPORT, VOCAB, lm_file
from pipeline.metrics import SampleResult, score_sample

TUNE_RESULT = "tune.json"


def read_lm_report(config: Config) -> Optional[dict]:
    """The LanguageModel report of this config, or None when the stage has not run."""
    path = layout.lm_dir(config) / REPORT
    return json.loads(path.read_text()) if path.is_file() else None


def tuned_values(config: Config) -> Optional[dict]:
    """``{"lm_alpha", "lm_beta"}`` from TuneDecoder when ``decoder.tune`` is on; None otherwise."""
    if not config.decoder.tune:
        return None
    path = layout.tune_dir(config) / TUNE_RESULT
    if not path.is_file():
        raise FileNotFoundError(f"{path}: decoder.tune is on but TuneDecoder has not run")
    return json.loads(path.read_text())["best"]


def configured_settings(config: Config) -> BeamSettings:
    """Beam settings exactly as the config writes them (no tuning)."""
    decoder = config.decoder
    return BeamSettings(beam_width=decoder.beam_width, beam_threshold=decoder.beam_threshold,
                        beam_size_token=decoder.beam_size_token, lm_alpha=decoder.lm_alpha, lm_beta=decoder.lm_beta, lexicon=decoder.lexicon)


def beam_settings(config: Config) -> BeamSettings:
    """Beam settings of the config, with TuneDecoder's alpha and beta when ``decoder.tune`` is on."""
    tuned = tuned_values(config) or {}
    return dataclasses.replace(configured_settings(config), **tuned_pair(tuned)) if tuned else configured_settings(config)


def tuned_pair(tuned: dict) -> dict:
    """Only the alpha/beta entries of a tuning result."""
    return {key: tuned[key] for key in ("lm_alpha", "lm_beta")}


def lm_paths(config: Config) -> tuple[Path, Path]:
    """(the LM the decoder uses, the vocabulary) from the LanguageModel stage's report."""
    report = read_lm_report(config)
    if report is None:
        raise FileNotFoundError(f"{layout.lm_dir(config)}: no language model; run the LanguageModel task")
    directory = layout.lm_dir(config)
    return lm_file(directory, report, "lm" if config.decoder.lexicon else "char_lm"), directory / VOCAB


def make_beam_decoder(config: Config, alphabet: Alphabet, settings: Optional[BeamSettings] = None) -> BeamDecoder:
    """A beam decoder over the LanguageModel stage's LM with ``settings`` (default: ``beam_settings``)."""
    lm, vocab = lm_paths(config)
    vocabulary = vocab.read_text(encoding="utf-8").split() if config.decoder.lexicon else None
    return BeamDecoder(alphabet, lm, settings or beam_settings(config), vocabulary)


def decode_results(decoder: BeamDecoder, greedy: list[SampleResult], logits: dict) -> list[SampleResult]:
    """Re-score ``greedy`` results with the beam decoder's transcripts of the same ``logits``."""
    return [score_sample(r.path, r.reference, decoder.decode(logits[i]), r.loss) for i, r in enumerate(greedy)]
