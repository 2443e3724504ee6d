"""Clean: every utterance of the cleaned splits scored against a model, suspect transcripts left out."""

from __future__ import annotations

import luigi

from tasks.base import ConfigTask, Progress, task_parameter


class Clean(ConfigTask):
    """The Clean stage (``data.clean``); output: its ``report.json``, beside the cleaned manifests,
    ``rejects.csv`` and ``scores.csv``, in ``clean/<fingerprint>`` (``data.clean``, the model's digest,
    the manifests it reads)."""

    stage = "clean"
    task = task_parameter()

    def requires(self):
        """The declaration's upstream, and the Export of the config ``data.clean.model`` names if it names
        one."""
        return {**super().requires(), **self.model_export(lambda layout: layout.config.data.clean.model)}

    def output(self):
        """The Clean folder's ``report.json`` (written last)."""
        return luigi.LocalTarget(str(self.layout.clean_files.report))

    def stage_complete(self):
        """Whether the Clean folder holds every file its report recorded, at the recorded size."""
        from pipeline.stages.imports import import_intact

        return import_intact(self.layout.clean_files)

    def run_stage(self):
        """Score every row, the count shown in the Luigi UI."""
        from pipeline.stages.clean import clean_stage

        progress = Progress(self, total=100, unit="%", description="clean")

        def report(done, total):
            fraction = done / max(total, 1)
            progress.update(round(100 * fraction), f"{done} of {total} rows scored", percent=100 * fraction)

        try:
            result = clean_stage(self.layout, report)
        finally:
            progress.close()
        self.tell_scheduler(
            message="; ".join(
                f"{split}: {s['rejected']} of {s['rows']} rejected as suspect_transcript"
                for split, s in result["splits"].items()
            )
        )
