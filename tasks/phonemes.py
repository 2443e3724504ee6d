"""The Phonemes task: a ``targets: phonemes`` task's manifests (its ``of`` task's rows in IPA)."""

from __future__ import annotations

import luigi

from tasks.base import ConfigTask, Progress, task_parameter


class Phonemes(ConfigTask):
    """Speak the transcripts of a phonemes task's ``of`` task as IPA (espeak-ng); output: the manifests and
    ``phonemes_report.json`` in a folder named by the task and the Phonemes fingerprint."""

    stage = "phonemes"
    task = task_parameter()

    def output(self):
        """The report (written last)."""
        return luigi.LocalTarget(str(self.layout.phonemes_files.report))

    def stage_complete(self):
        """Whether the report and every manifest it counted are there."""
        from pipeline.stages.phonemes import phonemes_intact

        return phonemes_intact(self.layout.phonemes_files)

    def run_stage(self):
        """Write the manifests; the rows spoken shown in the Luigi UI."""
        from pipeline.stages.phonemes import phonemes_stage

        progress = Progress(self, total=0, unit="row", description=f"phonemes {self.task}")
        try:
            report = phonemes_stage(self.layout, lambda rows: progress.update(rows, f"{rows} rows spoken"))
        finally:
            progress.close()
        self.tell_scheduler(percent=100)
        self.tell_scheduler(
            message=f"{sum(report.rows.values())} rows of task {report.of} in IPA ({report.voice}), "
            f"{sum(report.empty.values())} without phonemes"
        )
