"""The Evaluate stage: test-set WER/CER and loss of the best-dev checkpoint (or of the average of several,
``export.average``, whose dev figures it gives beside the single best's), greedy and with beam search + LM;
for a family whose inference is chunked, the greedy figures of the full-context computation beside."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.config import Config, is_transducer
from pipeline.dag import Node, Stage, alphabet_of, decoding_of, is_instance, task_config, task_param
from pipeline.decode.settings import decode_pool, decoder_settings, decoder_spec, describe
from pipeline.evaluation.logits_store import LogitsStore
from pipeline.evaluation.metrics import (
    ScoreBoard,
    corpus_rates,
    format_report,
    headline_metric,
    headline_text,
    score_sample,
)
from pipeline.files import atomic_path, remove_leftovers, write_text_atomic
from pipeline.layout import Layout
from pipeline.lm.files import lm_built, verify_lm_files
from pipeline.locks import stage_lock
from pipeline.model import model_family
from pipeline.model.labels import model_alphabet
from pipeline.reports import EvaluationReport, TrainReport, read_report, write_report
from pipeline.stages.outputs import split_cache
from pipeline.workdir import EVALUATE_DIR, LEFTOVER_PATTERNS

if TYPE_CHECKING:
    from pipeline.model.averaging import Averaging

log = logging.getLogger(__name__)


def _average_dev(config: Config, params: dict) -> list[Node]:
    """The dev features, for the dev figures of an averaged model (``export.average``): of the instance's
    task, when it has a dev split."""
    if not (config.export.average.count and task_config(config, params).has_split("dev")):
        return []
    return [("features", {"split": "dev", **task_param(params)})]


STAGE = Stage(
    "evaluate",
    "Evaluate",
    params=("task",),
    upstream=lambda config, params: [
        ("train", {}),
        ("features", {"split": "test", **task_param(params)}),
        *_average_dev(config, params),
        *decoding_of(config, params),
        *alphabet_of(config, params),
    ],
    runs=is_instance,
    directory=EVALUATE_DIR,
    outputs=lambda layout, params: [layout.evaluate_dir],
)


def evaluate_stage(
    layout: Layout,
    out_dir: Path | None = None,
    checkpoint: str | Path | None = None,
    beam: bool | None = None,
    on_progress: Callable[[str, int, int], None] = lambda phase, done, total: None,
) -> EvaluationReport:
    """Test-set WER, CER and loss of the best-dev checkpoint (or ``checkpoint``, or with ``export.average``
    and no ``checkpoint`` the average of several, reported with its dev figures beside the single best
    checkpoint's), greedy and (``beam``)
    with the configured decoder (``decoder.type``, beam search by default) and the LM as
    ``wer_lm``/``cer_lm``; ``beam=None`` uses the LM when the LanguageModel stage has run. Writes
    ``evaluation.json``, ``evaluation.txt`` and every utterance's result (``samples.jsonl``,
    ``samples_lm.jsonl``) into ``out_dir`` (default: the fingerprinted Evaluate directory). A family whose
    inference is chunked (``limits_context``: the Conformer) is scored as the export runs it, and its
    full-context greedy figures are added as ``wer_full_context``/``cer_full_context``.
    ``on_progress(phase, done, total)`` follows the
    greedy pass, the full-context pass and the beam decoding, utterance by utterance."""
    out_dir = Path(out_dir or layout.evaluate_dir)
    alphabet = model_alphabet(layout.config, layout.alphabet)
    test_data = split_cache(layout, "test")
    if is_transducer(layout.config):
        beam = False  # a transducer: the LM decoders read label scores; its figures are greedy only
    beam = beam or (beam is None and lm_built(layout.lm))
    if beam:
        verify_lm_files(layout.lm, deep=True)  # before the greedy pass, not after it
    with stage_lock(out_dir):
        # Every Evaluate writing here holds this lock: the scratch files found now are dead.
        remove_leftovers(out_dir, LEFTOVER_PATTERNS, locked_prefixes=(".",))
        return _evaluate(layout, out_dir, alphabet, test_data, checkpoint, beam, on_progress)


def _evaluate(layout, out_dir, alphabet, test_data, checkpoint, beam, on_progress) -> EvaluationReport:
    """The greedy pass (logits to a scratch file, each result to ``samples.jsonl``), then the beam pass over
    the stored logits (each result to ``samples_lm.jsonl``): per-utterance results are streamed to files,
    only the figures and the best and worst samples stay in memory."""
    # TensorFlow is loaded here, not when the DAG reads this module's declaration.
    from pipeline.evaluation.run import run_split
    from pipeline.model.averaging import stage_model

    config = layout.config
    model, checkpoint, averaging = stage_model(
        config, layout.train_run, checkpoint, test_data.n_input, alphabet.n_classes
    )
    total = len(test_data)
    losses = np.full(total, np.nan)  # the greedy pass's loss of each utterance, for the beam pass's records
    joint = _joint(config, test_data, alphabet)
    with LogitsStore(layout.logits_scratch(out_dir), total, alphabet.n_classes) as logits:
        with atomic_path(layout.evaluation_samples(out_dir)) as tmp, open(tmp, "w", encoding="utf-8") as sink:
            # CER leads where the references have no word spaces (Chinese, Japanese, Thai, ...)
            headline = headline_metric(test_data.transcripts)
            greedy = ScoreBoard(config.training.report_count, sink, headline)

            def keep_logits(index, sample_logits):
                logits.put(index, sample_logits)

            def keep_result(index, result):
                losses[index] = result.loss
                greedy.add(index, result)
                on_progress("greedy", greedy.samples, total)

            run_split(
                model,
                test_data,
                alphabet,
                config.training.dev_batch_size,
                on_logits=keep_logits if beam else None,
                max_batch_frames=config.training.max_batch_frames,
                bucket_growth=config.training.bucket_growth,
                on_result=keep_result,
                joint=joint,
            )
        rates, samples = greedy.rates(), greedy.best_and_worst()
        report = EvaluationReport(
            **rates,
            checkpoint=checkpoint,
            decoder="greedy",
            samples=samples,
            samples_file=layout.evaluation_samples(out_dir).name,
        )
        text = format_report("Test (greedy)", rates, samples)
        if model_family(config.model.architecture).limits_context(config.model):
            report, text = _full_context_pass(
                layout, model, alphabet, test_data, report, text, on_progress, joint
            )
        if averaging is not None:
            report, text = _average_on_dev(layout, model, alphabet, averaging, report, text)
        if beam:
            report, text = _beam_pass(
                layout,
                alphabet,
                test_data,
                logits,
                losses,
                out_dir,
                report,
                text,
                lambda count: on_progress("beam + LM", count, total),
            )
    log.info("%s", text)
    write_text_atomic(layout.evaluation_text(out_dir), text + "\n")
    write_report(layout.evaluation_report(out_dir), report)
    return report


def _average_on_dev(layout, model, alphabet, averaging: Averaging, report, text):
    """The averaged model's dev figures (greedy) beside the single best-dev checkpoint's from the Train
    report (its validation: the same pass over the same split), in the report's ``average`` and its text;
    for a task of a multi-task run, the task's dev split and its figures in the best checkpoint's
    validation. Without a dev split the average's are None."""
    from pipeline.evaluation.run import run_split

    config = layout.config
    dev = None
    if config.has_split("dev"):
        data = split_cache(layout, "dev")
        results = run_split(
            model,
            data,
            alphabet,
            config.training.dev_batch_size,
            max_batch_frames=config.training.max_batch_frames,
            bucket_growth=config.training.bucket_growth,
            joint=_joint(config, data, alphabet),
        )
        rates = corpus_rates(results)
        dev = {"loss": rates["loss"], "wer": rates["wer"], "cer": rates["cer"], "headline": rates["headline"]}
    best = read_report(layout.train_run.report, TrainReport).best_dev
    best = best and best.of_task(config.task)  # a task's: its own figures in that validation
    single = best and {"epoch": best.epoch, "loss": best.dev_loss, "wer": best.wer, "cer": best.cer}
    record = {**averaging.to_dict(), "dev": dev, "best_dev": single}
    lines = [f"Model: {averaging.describe()}"]
    if dev is not None:
        lines.append(f"Dev (greedy), the average: {headline_text(dev)}, loss {dev['loss']:.4f}")
    if single is not None:
        figures = headline_text({**single, "headline": (dev or {}).get("headline", "wer")})
        chosen = f", chosen by the tasks' weighted mean; task {config.task}'s figures" if config.task else ""
        lines.append(
            f"Dev (greedy), the single best checkpoint (epoch {single['epoch']}{chosen}): {figures}, "
            f"loss {single['loss']:.4f}"
        )
    return dataclasses.replace(report, average=record), "\n".join(lines) + "\n" + text


def _joint(config: Config, data, alphabet):
    """A transducer's cap on its joint scores for ``data``'s batches (``pipeline.batches.joint_cap``), else
    None; an utterance over it alone is refused in one line naming its audio."""
    from pipeline.batches.buckets import shape_grid
    from pipeline.train.joint_plans import checked_eval_cap

    return checked_eval_cap(config, data, shape_grid(data, config.training.bucket_growth), alphabet.n_classes)


def _full_context_pass(layout, model, alphabet, test_data, report, text, on_progress, joint=None):
    """The greedy figures of the family's full-context computation (no file of samples: the chunked pass's
    are the export's), in batches under the greedy pass's ``joint`` cap; returns the report and text with
    them added."""
    from pipeline.evaluation.run import model_forward, run_split

    config = layout.config
    board = ScoreBoard(0, None, report.headline)
    total = len(test_data)

    def keep_result(index, result):
        board.add(index, result)
        on_progress("full context", board.samples, total)

    run_split(
        model,
        test_data,
        alphabet,
        config.training.dev_batch_size,
        forward=model_forward(model, alphabet.blank_index, full_context=True),
        max_batch_frames=config.training.max_batch_frames,
        bucket_growth=config.training.bucket_growth,
        on_result=keep_result,
        joint=joint,
    )
    rates = board.rates()
    report = dataclasses.replace(report, wer_full_context=rates["wer"], cer_full_context=rates["cer"])
    return report, text + "\n" + format_report("Test (greedy, full context)", rates, {})


# Utterances decoded per call of the decode pool: its answer (the transcripts) is held per block only.
DECODE_BLOCK = 512


def _beam_pass(layout, alphabet, test_data, logits, losses, out_dir, report, text, on_done):
    """Beam search + LM over the stored logits, block by block; returns the report and text with the
    ``*_lm`` figures added."""
    config = layout.config
    spec = decoder_spec(
        layout.config, layout.lm, alphabet, decoder_settings(layout.config, layout.tune_report)
    )
    started = time.time()
    board_path = layout.evaluation_samples(out_dir, lm=True)
    stream = iter(logits)
    with (
        decode_pool(layout.config, spec) as pool,
        atomic_path(board_path) as tmp,
        open(tmp, "w", encoding="utf-8") as sink,
    ):
        board = ScoreBoard(config.training.report_count, sink, report.headline)
        for first in range(0, len(test_data), DECODE_BLOCK):
            block = itertools.islice(stream, DECODE_BLOCK)
            texts = pool.decode(block, on_done=lambda count, first=first: on_done(first + count))
            for index, hypothesis in enumerate(texts, first):
                path, reference = test_data.paths[index], test_data.transcripts[index]
                board.add(index, score_sample(path, reference, hypothesis, float(losses[index])))
    beam_rates, beam_samples = board.rates(), board.best_and_worst()
    report = dataclasses.replace(
        report,
        wer_lm=beam_rates["wer"],
        cer_lm=beam_rates["cer"],
        decoder_lm={"type": spec.type, **spec.settings},
        decode_lm_s=round(time.time() - started, 2),
        samples_lm=beam_samples,
        samples_lm_file=board_path.name,
    )
    text += "\n" + format_report(
        f"Test ({describe(spec)})",
        {**beam_rates, "loss": report.loss},
        beam_samples,
    )
    return report, text
