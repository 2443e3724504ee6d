"""Export and one-shot Transcribe tasks."""

from __future__ import annotations

import logging
from pathlib import Path

import luigi

from native_client.metadata import ExportError, verify_manifest
from pipeline.digests import file_digest
from pipeline.workdir import ExportFiles
from tasks.base import ConfigTask, Progress, task_parameter

log = logging.getLogger("luigi-interface")


class Export(ConfigTask):
    """Freeze the best-dev checkpoint into ``paths.export_dir``: SavedModel, frozen graph, TFLite, metadata,
    and the language model with its vocabulary and decoder settings (tuned ones when tuning is on).

    Complete when an export there (or one of its numbered versions) carries this
    config's export fingerprint, so a changed model or export setting exports again.
    """

    stage = "export"
    needs_tensorflow = True
    task = task_parameter()

    def output(self):
        found = self.layout.find_export() or self.layout.export_destination(None)
        return luigi.LocalTarget(str(found.metadata))

    def stage_complete(self):
        found = self.layout.find_export()
        if found is None:
            return False
        try:
            # Digests are remembered per (path, size, mtime): asking again does not re-read the files.
            verify_manifest(found.root, digest=file_digest)
        except ExportError as error:
            log.warning("%s; exporting again", error)
            return False
        return True

    def stage_paths(self):
        """A numbered version's directory, or, for an export in ``paths.export_dir`` itself, only the
        files and folders it wrote (the directory may hold other versions and a user's files)."""
        found = self.layout.find_export()
        if found is None:
            return []
        if found.root != self.layout.export_root:
            return [found.root]
        return [found.root / name for name in found.written_entries()]

    def run_stage(self):
        from pipeline.stages.export import export_stage

        progress = Progress(self, total=100, unit="%", description=f"export {self.task}".strip())
        try:
            destination = export_stage(self.layout, on_status=progress.percent, with_lm=True)
        finally:
            progress.close()
        self.tell_scheduler(percent=100)
        self.tell_scheduler(message=f"exported to {destination.root}")


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
