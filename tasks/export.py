"""Export and one-shot Transcribe tasks."""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import luigi

from pipeline import layout
from tasks.base import ConfigTask
from tasks.language_model import decoder_requirements
from tasks.training import Train

log = logging.getLogger("luigi-interface")


class Export(ConfigTask):
    """Freeze the best-dev checkpoint into ``paths.export_dir``: SavedModel, frozen graph, TFLite, metadata,
    and the language model with its vocabulary and decoder settings (tuned ones when tuning is on).

    Complete when an export there (or one of its numbered versions) carries this
    config's export fingerprint, so a changed model or export setting exports again.
    """

    def requires(self):
        return {"train": Train(config=self.config), **decoder_requirements(self)}

    def _export(self):
        return layout.find_export(self.cfg)

    def output(self):
        found = self._export()
        return luigi.LocalTarget(str((found or layout.export_dir(self.cfg)) / "metadata.json"))

    def complete(self):
        return self._export() is not None

    def stage_paths(self):
        found = self._export()
        return [found] if found else []

    def run(self):
        from pipeline.export import export_stage

        def status(message: str, percent: float) -> None:
            self.set_status_message(message)
            self.set_progress_percentage(percent)

        destination = export_stage(self.cfg, on_status=status, with_lm=True)
        self.set_progress_percentage(100)
        self.set_status_message(f"exported to {destination}")


class Transcribe(ConfigTask):
    """One-shot transcription of ``--audio`` with the export (as DeepSpeech's ``--one_shot_infer``).

    Prints the transcript (and the reference when a manifest of the config lists
    the file) and writes it as JSON into the export's ``transcripts/`` directory.
    """

    audio = luigi.Parameter(description="The audio file to transcribe.")

    def requires(self):
        return Export(config=self.config)

    def output(self):
        export = Path(self.input().path).parent
        audio = Path(self.audio).resolve()
        key = hashlib.sha256(str(audio).encode("utf-8")).hexdigest()[:10]
        return luigi.LocalTarget(str(export / "transcripts" / f"{audio.stem}-{key}.json"))

    def run(self):
        from native_client import open_model
        from native_client.beam import beam_decoder_for_export
        from pipeline.corpus import find_reference
        from pipeline.files import write_json_atomic

        export = Path(self.input().path).parent
        model = open_model(export, decoder_factory=beam_decoder_for_export)
        self.set_status_message(f"transcribing {self.audio}")
        result = model.transcribe_file(self.audio, convert_rate=self.cfg.features.resample)
        manifests = [f for split in layout.SPLITS for f in self.cfg.split_files(split)]
        reference = find_reference(manifests, self.audio)
        record = {**result.to_dict(), "reference": reference, "decoder": model.decoder.name,
                  "export": str(export), "model_version": model.metadata.model_version}
        write_json_atomic(self.output().path, record)
        lines = [f"audio:      {self.audio}"]
        if reference is not None:
            lines.append(f"reference:  {reference}")
        lines.append(f"hypothesis: {result.text}")
        print("\n".join(lines), flush=True)
        self.set_status_message(f"{result.text!r} ({result.duration_s:.1f} s audio, RTF {result.rtf:.3f})")
        self.set_progress_percentage(100)
