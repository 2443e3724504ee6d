"""Train and Evaluate as whole stages: wire config, devices, caches and the trainer; write the reports."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Optional

import tensorflow as tf
import yaml

from pipeline import layout
from pipeline.alphabet import load_alphabet
from pipeline.cache import read_cache
from pipeline.checkpoints import check_geometry, named_weights, resolve_checkpoint, weights_digest
from pipeline.config import Config, config_to_dict
from pipeline.decoding import beam_settings, decode_results, make_beam_decoder, read_lm_report
from pipeline.distribute import DistributionError, cluster_role, configure_devices, make_strategy
from pipeline.evaluation import run_split
from pipeline.files import write_json_atomic, write_text_atomic
from pipeline.locks import stage_lock
from pipeline.metrics import best_and_worst, corpus_rates, format_report
from pipeline.model import build_model
from pipeline.trainer import TrainHooks, Trainer

log = logging.getLogger(__name__)

REPORT_NAME = "train_report.json"
# What a collective operation raises when a peer worker died or stopped answering.
LOST_WORKER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
                      tf.errors.CancelledError, tf.errors.InternalError)


def train_stage(config: Config, run_dir: Optional[Path] = None, hooks: Optional[TrainHooks] = None) -> dict:
    """Train on the cached train split, validate on dev; write the resolved config and ``train_report.json``.

    Resumes from the checkpoints in ``run_dir`` (default: the fingerprinted Train directory).
    """
    run_dir = Path(run_dir or layout.train_dir(config))
    configure_devices(config.distribution)
    role = cluster_role()
    strategy = make_strategy(config.distribution)
    alphabet = load_alphabet(layout.alphabet_path(config))
    train_data = read_cache(layout.features_path(config, "train"), config.features)
    dev_data = read_cache(layout.features_path(config, "dev"), config.features) if config.data.dev_files else None
    if role.is_chief:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "config.yaml", yaml.safe_dump(config_to_dict(config), sort_keys=False))
    started = time.time()
    # Two pipelines whose configs share this Train fingerprint take turns on its directory;
    # the second resumes from the first one's checkpoints (and finds the run finished).
    with stage_lock(run_dir) if role.is_chief else contextlib.nullcontext():
        trainer = Trainer(config, run_dir, train_data, dev_data, alphabet, strategy, role, hooks)
        try:
            report = trainer.fit()
        except LOST_WORKER_ERRORS as error:
            if role.count == 1:
                raise
            raise DistributionError(
                f"worker {role.index} of {role.count}: lost contact with another worker "
                f"({type(error).__name__}: {str(error).splitlines()[0][:300]}). Every worker stops; restart all "
                f"of them to resume from the chief's last checkpoint in {run_dir / 'checkpoints'}") from error
    report["weights_sha256"] = weights_digest(trainer.model)
    report.update({"fingerprint": layout.train_fingerprint(config), "config": config.source,
                   "train_samples": len(train_data), "train_audio_hours": float(train_data.durations.sum()) / 3600,
                   "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_time_s": time.time() - started})
    if role.is_chief:
        write_json_atomic(run_dir / REPORT_NAME, report)
    return report


def load_trained_model(config: Config, checkpoint: str | Path, n_input: int, n_classes: int):
    """Build the model of ``config`` and load the weights of ``checkpoint`` (prefix or directory)."""
    prefix = resolve_checkpoint(checkpoint)
    model = build_model(config.model, n_input, n_classes)
    check_geometry(prefix, model, checkpoint)
    tf.train.Checkpoint(weights=named_weights(model)).read(prefix).expect_partial()
    return model


def evaluate_stage(config: Config, out_dir: Path, checkpoint: Optional[str | Path] = None,
                   beam: Optional[bool] = None) -> dict:
    """Test-set WER, CER and loss of the best-dev checkpoint, greedy and (``beam``) with beam search and
    the LM as ``wer_lm``/``cer_lm``; ``beam=None`` uses the LM when the LanguageModel stage has run.
    Writes ``evaluation.json`` and ``evaluation.txt``."""
    alphabet = load_alphabet(layout.alphabet_path(config))
    test_data = read_cache(layout.features_path(config, "test"), config.features)
    checkpoint = checkpoint or layout.train_dir(config) / "best"
    model = load_trained_model(config, checkpoint, test_data.features.shape[1], alphabet.n_classes)
    logits: dict = {}
    results = run_split(model, test_data, alphabet, config.training.dev_batch_size, config.model.n_context,
                        logits_sink=logits)
    rates = corpus_rates(results)
    samples = best_and_worst(results, config.training.report_count)
    report = {**rates, "checkpoint": str(resolve_checkpoint(checkpoint)), "decoder": "greedy",
              "samples": samples, "all_samples": [r.to_dict() for r in results]}
    text = format_report("Test (greedy)", rates, samples)
    if beam or (beam is None and read_lm_report(config) is not None):
        settings = beam_settings(config)
        started = time.time()
        beam_results = decode_results(make_beam_decoder(config, alphabet, settings), results, logits)
        beam_rates = corpus_rates(beam_results)
        beam_samples = best_and_worst(beam_results, config.training.report_count)
        report.update({"wer_lm": beam_rates["wer"], "cer_lm": beam_rates["cer"], "decoder_lm": dataclasses.asdict(settings),
                       "decode_lm_s": round(time.time() - started, 2), "samples_lm": beam_samples,
                       "all_samples_lm": [r.to_dict() for r in beam_results]})
        text += "\n" + format_report(f"Test (beam {settings.beam_width} + LM, alpha {settings.lm_alpha:.2f}, "
                                      f"beta {settings.lm_beta:.2f})", {**beam_rates, "loss": rates["loss"]}, beam_samples)
    log.info("%s", text)
    out_dir = Path(out_dir)
    write_text_atomic(out_dir / "evaluation.txt", text + "\n")
    write_json_atomic(out_dir / "evaluation.json", report)
    return report


def read_train_report(run_dir: Path) -> Optional[dict]:
    """The report of a finished Train run, or None."""
    path = Path(run_dir) / REPORT_NAME
    return json.loads(path.read_text()) if path.exists() else None
