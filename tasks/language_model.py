"""The LanguageModel task."""

from __future__ import annotations

import luigi

from tasks.base import ConfigTask, Progress, task_parameter


class LanguageModel(ConfigTask):
    """Build the word n-gram LM (modified Kneser-Ney, ARPA) and vocabulary, or adopt ``decoder.lm_path``."""

    stage = "lm"
    task = task_parameter()

    def output(self):
        return luigi.LocalTarget(str(self.layout.lm.report))

    def stage_complete(self):
        from pipeline.stages.language_model import lm_intact

        # A changed or truncated LM file (size or modification time) makes the stage run again.
        return self.layout.lm.report.is_file() and lm_intact(self.layout)

    def run_stage(self):
        from pipeline.stages.language_model import language_model_stage

        progress = Progress(self, total=100, unit="%", description="language model")
        try:
            report = language_model_stage(self.layout, on_status=progress.percent)
        finally:
            progress.close()
        self.tell_scheduler(percent=100)
        self.tell_scheduler(
            message=f"{report.sentences} sentences, vocabulary {report.vocabulary}, "
            f"n-grams {report.ngrams or 'from lm_path'}"
        )
