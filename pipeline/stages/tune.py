"""TuneDecoder: search lm_alpha / lm_beta on the dev set with Optuna's TPE sampler."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config import ConfigError, is_transducer
from pipeline.config_checks import task_source
from pipeline.dag import Stage, alphabet_of, is_instance, task_config, task_param
from pipeline.decode.settings import configured_settings, decode_pool, decoder_spec, rescore
from pipeline.evaluation.logits_store import LogitsStore
from pipeline.evaluation.metrics import corpus_rates, headline_metric
from pipeline.files import remove_leftovers
from pipeline.layout import Layout
from pipeline.lm.files import verify_lm_files
from pipeline.locks import stage_lock
from pipeline.model.labels import model_alphabet
from pipeline.reports import TunedPair, TuneReport, write_report
from pipeline.stages.outputs import split_cache
from pipeline.workdir import LEFTOVER_PATTERNS, TUNE_DIR

if TYPE_CHECKING:
    import optuna

    from pipeline.decode.pool import DecodePool

log = logging.getLogger(__name__)

ALPHA_RANGE = (0.0, 5.0)
BETA_RANGE = (-2.0, 5.0)


STAGE = Stage(
    "tune",
    "TuneDecoder",
    params=("task",),
    upstream=lambda config, params: [
        ("train", {}),
        ("lm", task_param(params)),
        ("features", {"split": "dev", **task_param(params)}),
        *alphabet_of(config, params),
    ],
    runs=lambda config, params: (
        is_instance(config, params)
        and task_config(config, params).decoder.tune
        and not is_transducer(task_config(config, params))  # it reads no LM
    ),
    directory=TUNE_DIR,
    outputs=lambda layout, params: [layout.tune_dir],
)


def tune_stage(
    layout: Layout,
    on_trial: Callable[[int, int, dict], None] = lambda done, total, best: None,
    report_path: Path | None = None,
) -> TuneReport:
    """Decode the dev split's logits with the configured decoder (``decoder.type``) over
    ``decoder.tune_trials`` (alpha, beta) pairs; the best pair has the lowest dev WER (CER breaks ties), or
    the lowest CER (WER breaking ties) where the language writes no spaces between words.
    Writes ``tune.json`` (default: the fingerprinted TuneDecoder directory's) with the best pair and
    every trial."""
    config = layout.config
    if is_transducer(config):  # preflight refuses it first; this guards any other caller
        where = task_source(config, config.task) if config.task else config.source
        raise ConfigError(
            f"{where}: model.objective: transducer: the LM decoders TuneDecoder tunes read label scores, "
            f"which a transducer does not emit"
        )
    alphabet = model_alphabet(layout.config, layout.alphabet)
    dev = split_cache(layout, "dev")
    verify_lm_files(layout.lm, deep=True)  # before the greedy pass, not after it
    with stage_lock(layout.tune_dir):
        # Every TuneDecoder writing here holds this lock: the scratch files found now are dead.
        remove_leftovers(layout.tune_dir, LEFTOVER_PATTERNS, locked_prefixes=(".logits-",))
        return _tune(layout, alphabet, dev, on_trial, report_path)


def _tune(layout, alphabet, dev, on_trial, report_path) -> TuneReport:
    # TensorFlow is loaded here, not when the DAG reads this module's declaration.
    from pipeline.evaluation.run import run_split
    from pipeline.model.averaging import stage_model

    config = layout.config
    model, _, _ = stage_model(config, layout.train_run, None, dev.n_input, alphabet.n_classes)
    base = configured_settings(config)
    started = time.time()
    with LogitsStore(layout.logits_scratch(layout.tune_dir), len(dev), alphabet.n_classes) as logits:
        greedy = run_split(
            model,
            dev,
            alphabet,
            config.training.dev_batch_size,
            on_logits=logits.put,
            max_batch_frames=config.training.max_batch_frames,
            bucket_growth=config.training.bucket_growth,
        )
        headline = headline_metric(r.reference for r in greedy)
        with decode_pool(config, decoder_spec(config, layout.lm, alphabet, base)) as pool:
            trials = _search(config, base, greedy, logits, pool, on_trial, headline)
    best = min(trials, key=_ranking(headline))
    greedy_rates = corpus_rates(greedy, headline)
    result = TuneReport(
        best=TunedPair(lm_alpha=best["lm_alpha"], lm_beta=best["lm_beta"], wer=best["wer"], cer=best["cer"]),
        greedy={"wer": greedy_rates["wer"], "cer": greedy_rates["cer"]},
        search={
            "sampler": "optuna TPE",
            "alpha_range": list(ALPHA_RANGE),
            "beta_range": list(BETA_RANGE),
            "decoder": config.decoder.type,
            "beam_width": base["beam_width"],
            "lexicon": base["lexicon"],
            "dev_samples": len(dev),
            "objective": headline,
        },
        trials=trials,
        wall_time_s=round(time.time() - started, 1),
    )
    write_report(report_path or layout.tune_report, result)
    log.info(
        "Tuned: alpha %.3f beta %.3f dev WER %.4f (greedy %.4f)",
        best["lm_alpha"],
        best["lm_beta"],
        best["wer"],
        greedy_rates["wer"],
    )
    return result


def _ranking(headline: str):
    """The sort key of trials: the headline rate, the other one breaking ties."""
    other = "cer" if headline == "wer" else "wer"
    return lambda trial: (trial[headline], trial[other])


def _search(
    config,
    base,
    greedy: list,
    logits: LogitsStore,
    pool: DecodePool,
    on_trial: Callable[[int, int, dict], None],
    headline: str = "wer",
) -> list[dict]:
    """Optuna's TPE search over (alpha, beta), starting from the configured pair, minimising the
    ``headline`` rate; every trial, in order."""
    import optuna

    other = "cer" if headline == "wer" else "wer"
    trials = []

    def objective(trial: optuna.Trial) -> float:
        alpha = trial.suggest_float("lm_alpha", *ALPHA_RANGE)
        beta = trial.suggest_float("lm_beta", *BETA_RANGE)
        rates = corpus_rates(rescore(greedy, pool.decode(logits, weights=(alpha, beta))), headline)
        trials.append(
            {
                "trial": trial.number,
                "lm_alpha": alpha,
                "lm_beta": beta,
                "wer": rates["wer"],
                "cer": rates["cer"],
            }
        )
        best = min(trials, key=_ranking(headline))
        on_trial(len(trials), config.decoder.tune_trials, best)
        return rates[headline] + 1e-3 * rates[other]

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="minimize", sampler=optuna.samplers.TPESampler(seed=config.model.random_seed)
    )
    # Start from the configured pair so tuning can only improve on it.
    study.enqueue_trial(
        {
            "lm_alpha": min(max(base["lm_alpha"], ALPHA_RANGE[0]), ALPHA_RANGE[1]),
            "lm_beta": min(max(base["lm_beta"], BETA_RANGE[0]), BETA_RANGE[1]),
        }
    )
    study.optimize(objective, n_trials=config.decoder.tune_trials)
    return trials
