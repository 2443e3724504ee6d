"""Where things are: the work directory, stage fingerprints and stage output paths.

A stage's fingerprint hashes exactly the settings it depends on plus the
fingerprints of the stages it reads, so changing ``model.n_hidden`` moves
Train and everything after it, never Features.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

from xdg import BaseDirectory

from native_client.metadata import METADATA_NAME

from pipeline.config import APP_NAME, Config

SPLITS = ("train", "dev", "test")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def work_dir(config: Config) -> Path:
    """The directory that holds every stage output."""
    if config.paths.work_dir:
        return Path(config.paths.work_dir)
    return Path(BaseDirectory.xdg_data_home) / APP_NAME


def export_dir(config: Config) -> Path:
    """Where Export writes (``paths.export_dir``, default ``<work_dir>/export``)."""
    if config.paths.export_dir:
        return Path(config.paths.export_dir)
    return work_dir(config) / "export"


def alphabet_path(config: Config) -> Path:
    """The alphabet file (``paths.alphabet``, default the project's ``data/alphabet.txt``)."""
    if config.paths.alphabet:
        return Path(config.paths.alphabet)
    return PROJECT_ROOT / "data" / "alphabet.txt"


def _file_digest(path: str | Path) -> str:
    """Hash of a file's bytes, or a marker when it is missing (the stage will report that)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "missing"


def _section_settings(section) -> dict:
    """The fields of a config section that affect results (metadata ``fingerprint``)."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)
            if f.metadata.get("fingerprint", True)}


def _hash(payload: dict) -> str:
    text = json.dumps(payload, sort_keys=True, default=list)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def features_fingerprint(config: Config, split: str) -> str:
    """Settings of the Features stage for ``split``: feature settings, manifests (path and content), limit, alphabet."""
    files = config.split_files(split)
    return _hash({
        "stage": "features",
        "features": _section_settings(config.features),
        "manifests": [[str(f), _file_digest(f)] for f in files],
        "limit": config.split_limit(split),
        "max_reject_fraction": config.data.max_reject_fraction,
        "alphabet": _file_digest(alphabet_path(config)),
    })


def train_fingerprint(config: Config) -> str:
    """Settings of Train: model, training, early stop, distribution, and the train/dev features."""
    return _hash({
        "stage": "train",
        "model": _section_settings(config.model),
        "training": _section_settings(config.training),
        "early_stop": _section_settings(config.early_stop),
        "distribution": _section_settings(config.distribution),
        "init_from": _file_digest(config.training.init_from) if config.training.init_from and Path(config.training.init_from).is_file() else config.training.init_from,
        "features": [features_fingerprint(config, "train"), features_fingerprint(config, "dev")],
    })


def lm_fingerprint(config: Config) -> str:
    """Settings of LanguageModel: order, corpus texts, alphabet, and the train manifests when included."""
    decoder = config.decoder
    return _hash({
        "stage": "lm",
        "order": decoder.lm_order,
        "lm_path": [decoder.lm_path, _file_digest(decoder.lm_path)] if decoder.lm_path else None,
        "corpus": [[str(f), _file_digest(f)] for f in decoder.lm_corpus_files],
        "train": [[_file_digest(f) for f in config.data.train_files], config.data.limit_train] if decoder.lm_include_train else None,
        "alphabet": _file_digest(alphabet_path(config)),
        "char_lm_order": None if decoder.lexicon else decoder.char_lm_order,
    })


def tune_fingerprint(config: Config) -> str:
    """Settings of TuneDecoder: the trained model, the LM, the dev features and the search settings."""
    decoder = config.decoder
    return _hash({
        "stage": "tune",
        "train": train_fingerprint(config),
        "epochs": config.training.epochs,
        "lm": lm_fingerprint(config),
        "dev": features_fingerprint(config, "dev"),
        "search": [decoder.tune_trials, decoder.beam_width, decoder.beam_threshold, decoder.beam_size_token, decoder.lexicon],
    })


def decoder_fingerprints(config: Config) -> dict:
    """What decoding with the LM depends on: the LM, and the tuning run when tuning is on."""
    return {"lm": lm_fingerprint(config), "tune": tune_fingerprint(config) if config.decoder.tune else None}


def evaluate_fingerprint(config: Config) -> str:
    """Settings of Evaluate: the trained model, the test features and the decoder."""
    return _hash({
        "stage": "evaluate",
        "train": train_fingerprint(config),
        "epochs": config.training.epochs,
        "test": features_fingerprint(config, "test"),
        "decoder": _section_settings(config.decoder),
        "decoding": decoder_fingerprints(config),
    })


def export_fingerprint(config: Config) -> str:
    """Settings of Export: the trained model (and its epochs), the export settings, features and alphabet."""
    return _hash({
        "stage": "export",
        "train": train_fingerprint(config),
        "epochs": config.training.epochs,
        "export": _section_settings(config.export),
        "features": _section_settings(config.features),
        "alphabet": _file_digest(alphabet_path(config)),
        "decoder": _section_settings(config.decoder),
        "decoding": decoder_fingerprints(config),
    })


def features_path(config: Config, split: str) -> Path:
    """The HDF5 cache of ``split``."""
    return work_dir(config) / "features" / f"{split}-{features_fingerprint(config, split)}.h5"


def train_dir(config: Config) -> Path:
    """The Train run directory (checkpoints, best-dev checkpoint, summaries, report)."""
    return work_dir(config) / "train" / train_fingerprint(config)


def lm_dir(config: Config) -> Path:
    """The LanguageModel output directory (ARPA, vocabulary, report)."""
    return work_dir(config) / "lm" / lm_fingerprint(config)


def tune_dir(config: Config) -> Path:
    """The TuneDecoder output directory (best alpha/beta and the table of trials)."""
    return work_dir(config) / "tune" / tune_fingerprint(config)


def evaluate_dir(config: Config) -> Path:
    """The Evaluate report directory."""
    return work_dir(config) / "evaluate" / evaluate_fingerprint(config)


def find_export(config: Config) -> Path | None:
    """The export carrying this config's export fingerprint: ``paths.export_dir`` itself or its
    newest numbered version that matches; None when there is none."""
    root = export_dir(config)
    fingerprint = export_fingerprint(config)
    versions = sorted((p for p in root.iterdir() if re.fullmatch(r"\d+", p.name)), key=lambda p: -int(p.name)) if root.is_dir() else []
    for candidate in [root, *versions]:
        meta = candidate / METADATA_NAME
        try:
            if json.loads(meta.read_text(encoding="utf-8")).get("fingerprint") == fingerprint:
                return candidate
        except (OSError, ValueError):
            continue
    return None
