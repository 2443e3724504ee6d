"""The schema's cross-checks: what involves more than one key, or the code a key names (a model family,
a decoder, the Coqui export's features). The loader runs them on every config it makes
(``pipeline.config_loader``); the schema (``pipeline.config``) only says what a config is."""

from __future__ import annotations

import re

from native_client.plugins import plugin_exists
from pipeline.config import Config, ConfigError
from pipeline.export.coqui_tflite import check_exportable
from pipeline.features.frontend import feature_pipeline


def validate_config(config: Config) -> None:
    """Checks that involve more than one key; raises ConfigError naming the file and the key."""
    src = config.source
    augment = config.augment
    if any(not 0.5 <= f <= 2.0 for f in augment.speed_factors):
        raise ConfigError(
            f"{src}: augment.speed_factors: expected factors between 0.5 and 2.0, "
            f"got {list(augment.speed_factors)}"
        )
    if len(augment.noise_snr_db) != 2 or augment.noise_snr_db[0] > augment.noise_snr_db[1]:
        raise ConfigError(
            f"{src}: augment.noise_snr_db: expected [low, high] with low <= high, "
            f"got {list(augment.noise_snr_db)}"
        )
    if (augment.gain_db or augment.noise_dir) and not augment.copies:
        raise ConfigError(
            f"{src}: augment.gain_db / augment.noise_dir act on copies: "
            "set augment.speed_factors or augment.audio_copies"
        )
    if not plugin_exists("pipeline.model", config.model.architecture):
        raise ConfigError(
            f"{src}: model.architecture: no model family {config.model.architecture!r} "
            f"(a module of pipeline/model/ such as deepspeech, or the dotted name of your own)"
        )

    if config.export.coqui_tflite:
        if config.model.output != "characters":
            raise ConfigError(
                f"{src}: export.coqui_tflite: their layout serialises a character alphabet; "
                f"model.output {config.model.output!r} cannot be written in it"
            )
        try:
            check_exportable(feature_pipeline(config.features), config.model.architecture)
        except ValueError as error:
            raise ConfigError(f"{src}: export.coqui_tflite: {error}") from None
    average = config.export.average
    if average.last and average.best:
        raise ConfigError(
            f"{src}: export.average: give last or best, not both (last {average.last}, best {average.best})"
        )
    if average.best and not (config.has_split("dev") and config.training.validation_epochs > 0):
        raise ConfigError(
            f"{src}: export.average.best ranks checkpoints by their validation, and this config has none "
            f"(no dev split, or training.validation_epochs 0); use export.average.last"
        )
    if config.training.epochs == 0:
        raise ConfigError(f"{src}: training.epochs: expected a non-zero integer, got 0")
    decoder = config.decoder
    if not plugin_exists("native_client.decoders", decoder.type):
        raise ConfigError(
            f"{src}: decoder.type: no decoder {decoder.type!r} (a module of native_client/decoders/ such as "
            f"beam or greedy, or the dotted name of your own)"
        )
    if not re.fullmatch(r"\d+(\.\d+)?[%bBkKmMgGtT]?", decoder.lm_memory):
        raise ConfigError(
            f"{src}: decoder.lm_memory: expected a size such as 2G, 500M or 50%, got {decoder.lm_memory!r}"
        )
    if decoder.lm_prune and (
        len(decoder.lm_prune) > decoder.lm_order
        or min(decoder.lm_prune) < 0
        or list(decoder.lm_prune) != sorted(decoder.lm_prune)
    ):
        raise ConfigError(
            f"{src}: decoder.lm_prune: expected at most decoder.lm_order ({decoder.lm_order}) "
            f"non-decreasing thresholds, got {list(decoder.lm_prune)}"
        )
    if (decoder.lm_prune or decoder.lm_top_k) and decoder.lm_builder == "python":
        raise ConfigError(
            f"{src}: decoder.lm_prune / decoder.lm_top_k need decoder.lm_builder kenlm or auto "
            f"(the Python estimator neither prunes nor filters)"
        )
