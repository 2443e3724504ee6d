"""The Export task."""

from __future__ import annotations

import logging

import luigi

from native_client.metadata import ExportError, verify_manifest
from pipeline.digests import file_digest
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
