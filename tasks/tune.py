"""The TuneDecoder task."""

from __future__ import annotations

import luigi

from tasks.base import ConfigTask, Progress, task_parameter


class TuneDecoder(ConfigTask):
    """Search lm_alpha/lm_beta on the dev set (``decoder.tune_trials`` Optuna trials);
    writes ``tune.json``."""

    stage = "tune"
    needs_tensorflow = True
    task = task_parameter()

    def output(self):
        return luigi.LocalTarget(str(self.layout.tune_report))

    def run_stage(self):
        from pipeline.stages.tune import tune_stage

        progress = Progress(
            self, total=self.cfg.decoder.tune_trials, unit="trial", description="tune decoder"
        )

        def trial(done: int, total: int, best: dict) -> None:
            progress.update(
                done,
                f"trial {done}/{total}: best alpha {best['lm_alpha']:.2f}, "
                f"beta {best['lm_beta']:.2f}, dev WER {best['wer']:.4f}",
                force=True,
            )

        try:
            tune_stage(self.layout, on_trial=trial)
        finally:
            progress.close()
