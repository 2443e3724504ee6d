"""The Evaluate task."""

from __future__ import annotations

import luigi

from tasks.base import ConfigTask, Progress, task_parameter


class Evaluate(ConfigTask):
    """Test-set report of the best-dev checkpoint, greedy and with the configured decoder + LM:
    ``evaluation.json`` (wer, cer, wer_lm, cer_lm, loss, samples) and ``evaluation.txt``."""

    stage = "evaluate"
    needs_tensorflow = True
    task = task_parameter()

    def output(self):
        return luigi.LocalTarget(str(self.layout.evaluation_report(self.layout.evaluate_dir)))

    def run_stage(self):
        from pipeline.evaluation.metrics import headline_text
        from pipeline.stages.evaluate import evaluate_stage

        progress = Progress(self, total=1, unit="utt", description=f"evaluate {self.task}".strip())

        def on_progress(phase: str, done: int, total: int) -> None:
            # The greedy pass is the first half, the beam decoding (after a chunked family's full-context
            # pass) the second.
            progress.bar.total = 2 * total
            offset = total if phase != "greedy" else 0
            progress.update(offset + done, f"{phase}: {done}/{total} test utterances")

        try:
            # beam + LM where the model emits label scores (a transducer's figures are greedy only)
            report = evaluate_stage(self.layout, beam=True, on_progress=on_progress)
        finally:
            progress.close()
        self.tell_scheduler(percent=100)
        summary = (
            f"greedy {headline_text({'wer': report.wer, 'cer': report.cer, 'headline': report.headline})}; "
        )
        if report.decoder_lm is not None:  # none for a transducer, which the LM decoders do not read
            lm = {"wer": report.wer_lm, "cer": report.cer_lm, "headline": report.headline}
            summary += f"{report.decoder_lm['type']}+LM {headline_text(lm)}; "
        summary += f"loss {report.loss:.3f}"
        if report.cer_full_context is not None:
            full = {
                "wer": report.wer_full_context,
                "cer": report.cer_full_context,
                "headline": report.headline,
            }
            summary += f"; greedy full context {headline_text(full)}"
        self.tell_scheduler(message=summary)
        task = f" of task {self.task}" if self.task else ""
        print(f"Test{task} {summary} ({report.samples_count} samples) -> {self.output().path}")
