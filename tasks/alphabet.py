"""The Alphabet task: the alphabet of the normalised training transcripts (``paths.alphabet: auto``)."""

from __future__ import annotations

import luigi

from tasks.base import ConfigTask, Progress, task_parameter


class Alphabet(ConfigTask):
    """Build the alphabet from the training transcripts after ``data.text`` normalisation; output:
    ``alphabet_report.json`` (the characters and their counts, those left out with the rows they cost)
    beside ``alphabet.txt``, in a folder named by the Alphabet fingerprint."""

    stage = "alphabet"
    task = task_parameter()

    def output(self):
        """The report (written last)."""
        return luigi.LocalTarget(str(self.layout.alphabet_files.report))

    def stage_complete(self):
        """Whether the alphabet is there with the digest its report recorded (two small files read)."""
        from pipeline.model.labels import alphabet_intact

        return alphabet_intact(self.layout.alphabet_files)

    def run_stage(self):
        """Build the alphabet; the rows read and what was left out shown in the Luigi UI."""
        from pipeline.stages.alphabet import alphabet_stage

        progress = Progress(self, total=0, unit="row", description="alphabet")
        try:
            report = alphabet_stage(self.layout, lambda rows: progress.update(rows, f"{rows} rows read"))
        finally:
            progress.close()
        left_out = " ".join(d["char"] for d in report.dropped)
        self.set_progress_percentage(100)
        self.set_status_message(
            f"{report.labels} labels from {report.rows} rows"
            + (f"; left out {left_out!r}, costing {report.rows_lost} rows" if report.dropped else "")
        )
