"""The Evaluate stage: test-set WER/CER and loss of the best-dev checkpoint, greedy and with beam search + LM."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.decode.settings import decode_pool, decoder_spec, describe, rescore
from pipeline.evaluation.logits_store import LogitsStore
from pipeline.evaluation.metrics import best_and_worst, corpus_rates, format_report
from pipeline.evaluation.run import run_split
from pipeline.features.cache import read_cache
from pipeline.files import remove_leftovers, write_text_atomic
from pipeline.layout import LEFTOVER_PATTERNS, Layout
from pipeline.lm.files import lm_built, verify_lm_files
from pipeline.model.checkpoints import load_trained_model, resolve_checkpoint
from pipeline.reports import EvaluationReport, write_report
from pipeline.stages.alphabet import model_alphabet

log = logging.getLogger(__name__)


def evaluate_stage(
    layout: Layout,
    out_dir: Path | None = None,
    checkpoint: str | Path | None = None,
    beam: bool | None = None,
    on_progress: Callable[[str, int, int], None] = lambda phase, done, total: None,
) -> EvaluationReport:
    """Test-set WER, CER and loss of the best-dev checkpoint (or ``checkpoint``), greedy and (``beam``)
    with the configured decoder (``decoder.type``, beam search by default) and the LM as
    ``wer_lm``/``cer_lm``; ``beam=None`` uses the LM when the
    LanguageModel stage has run. Writes ``evaluation.json`` and ``evaluation.txt`` into ``out_dir``
    (default: the fingerprinted Evaluate directory). ``on_progress(phase, done, total)`` follows the
    greedy pass and the beam decoding, utterance by utterance."""
    config = layout.config
    out_dir = Path(out_dir or layout.evaluate_dir)
    alphabet = model_alphabet(layout)
    test_data = read_cache(layout.features_cache("test"), config.features)
    checkpoint = checkpoint or layout.train_run.best
    beam = beam or (beam is None and lm_built(layout))
    if beam:
        verify_lm_files(layout, deep=True)  # before the greedy pass, not after it
    remove_leftovers(out_dir, LEFTOVER_PATTERNS)
    model = load_trained_model(config, checkpoint, test_data.n_input, alphabet.n_classes)
    total = len(test_data)
    with LogitsStore(layout.logits_scratch(out_dir), total, alphabet.n_classes) as logits:
        done = [0]

        def keep(index, sample_logits):
            logits.put(index, sample_logits)
            done[0] += 1
            on_progress("greedy", done[0], total)

        results = run_split(
            model,
            test_data,
            alphabet,
            config.training.dev_batch_size,
            on_logits=keep,
            max_batch_frames=config.training.max_batch_frames,
        )
        report, text = _report(
            layout,
            alphabet,
            results,
            logits,
            checkpoint,
            beam,
            lambda count: on_progress("beam + LM", count, total),
        )
    log.info("%s", text)
    write_text_atomic(layout.evaluation_text(out_dir), text + "\n")
    write_report(layout.evaluation_report(out_dir), report)
    return report


def _report(
    layout: Layout,
    alphabet,
    results: list,
    logits: LogitsStore,
    checkpoint,
    beam: bool | None,
    on_done: Callable[[int], None],
):
    """The evaluation report and its text: greedy figures, and beam + LM ones when asked."""
    config = layout.config
    rates = corpus_rates(results)
    samples = best_and_worst(results, config.training.report_count, rates["headline"])
    report = EvaluationReport(
        **rates,
        checkpoint=str(resolve_checkpoint(checkpoint)),
        decoder="greedy",
        samples=samples,
        all_samples=[r.to_dict() for r in results],
    )
    text = format_report("Test (greedy)", rates, samples)
    if beam:
        spec = decoder_spec(layout, alphabet)
        started = time.time()
        with decode_pool(layout, spec) as pool:
            beam_results = rescore(results, pool.decode(logits, on_done=on_done))
        beam_rates = corpus_rates(beam_results, rates["headline"])
        beam_samples = best_and_worst(beam_results, config.training.report_count, rates["headline"])
        report = dataclasses.replace(
            report,
            wer_lm=beam_rates["wer"],
            cer_lm=beam_rates["cer"],
            decoder_lm={"type": spec.type, **spec.settings},
            decode_lm_s=round(time.time() - started, 2),
            samples_lm=beam_samples,
            all_samples_lm=[r.to_dict() for r in beam_results],
        )
        text += "\n" + format_report(
            f"Test ({describe(spec)})",
            {**beam_rates, "loss": rates["loss"]},
            beam_samples,
        )
    return report, text
