"""The Transcribe task."""

from __future__ import annotations

from pathlib import Path

import luigi

from pipeline.workdir import ExportFiles
from tasks.base import ConfigTask, task_parameter


class Transcribe(ConfigTask):
    """One-shot transcription of ``--audio`` with the export (as DeepSpeech's ``--one_shot_infer``).

    Prints the transcript (and the reference when a manifest of the config lists
    the file) and writes it as JSON into the export's transcripts folder.
    """

    stage = "transcribe"
    needs_tensorflow = True

    audio = luigi.Parameter(description="The audio file to transcribe.")
    task = task_parameter()

    def _export(self) -> ExportFiles:
        (export,) = self.input().values()  # the Export of this config (of this task)
        return ExportFiles(Path(export.path).parent)

    def output(self):
        return luigi.LocalTarget(str(self._export().transcript(self.audio, self.layout.export_fingerprint)))

    def complete(self):
        """Never: a Transcribe asked for again prints its transcript again (from the record an earlier run
        kept for this very file and export, without decoding)."""
        return False

    def run_stage(self):
        from pipeline.stages.transcribe import keep_transcript, stored_transcript, transcribe_stage

        record = stored_transcript(self.layout, self._export(), self.audio)
        if record is None:
            self.tell_scheduler(message=f"transcribing {self.audio}")
            record = transcribe_stage(self.layout, self._export(), self.audio)
            self._print(record)
            keep_transcript(self.layout, self._export(), self.audio, record)
        else:
            self._print(record)
        self.tell_scheduler(
            message=f"{record['text']!r} ({record['duration_s']:.1f} s audio, RTF {record['rtf']:.3f})"
        )
        self.tell_scheduler(percent=100)

    def _print(self, record: dict) -> None:
        lines = [f"audio:      {self.audio}"]
        if self.layout.task:  # a multi-task config transcribes with each task's export in turn
            lines.insert(0, f"task:       {self.layout.task}")
        if record["reference"] is not None:
            lines.append(f"reference:  {record['reference']}")
        lines.append(f"hypothesis: {record['text']}")
        print("\n".join(lines), flush=True)
