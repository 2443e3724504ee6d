"""Align: a corpus of long recordings with their whole text -> train/dev/test manifests of utterances."""

from __future__ import annotations

import luigi

from tasks.base import ConfigTask, Progress, task_parameter


class Align(ConfigTask):
    """The alignment of one ``recordings`` corpus (``--corpus``: its key); output: its ``report.json``, the
    manifests and rejects beside it, in ``align/<corpus>-<fingerprint>`` (the recordings and texts by
    name, size and modification time, the ``align`` settings, the aligner model's digest)."""

    stage = "align"
    corpus = luigi.Parameter(
        description="The corpus's key (data.corpora[].name, default <importer>-<folder name>)."
    )
    task = task_parameter()

    def requires(self):
        """The declaration's upstream, and the Export of the config ``align.model`` names if it names one."""
        return {**super().requires(), **self.model_export(lambda layout: layout.aligner(self.corpus))}

    def output(self):
        """The alignment's ``report.json`` (written last)."""
        return luigi.LocalTarget(str(self.layout.align_files(self.corpus).report))

    def stage_complete(self):
        """Whether the Align folder holds every file its report recorded, at the recorded size."""
        from pipeline.stages.imports import import_intact

        return import_intact(self.layout.align_files(self.corpus))

    def run_stage(self):
        """Align every recording, the recordings and hours done shown in the Luigi UI."""
        from pipeline.stages.align import align_stage

        progress = Progress(self, total=100, unit="%", description=f"align {self.corpus}")

        def report(done, total, hours):
            progress.update(
                round(100 * done / total),
                f"{self.corpus}: {done} of about {total} recordings aligned ({hours:.2f} h of audio)",
                percent=100 * done / total,
            )

        try:
            result = align_stage(self.layout, self.corpus, report)
        finally:
            progress.close()
        splits = ", ".join(
            f"{split} {s['utterances']} ({s['hours']:.2f} h, {s['recordings']} recordings)"
            for split, s in result["splits"].items()
        )
        self.tell_scheduler(percent=100)
        self.tell_scheduler(
            message=f"{self.corpus}: {result['recordings']} recordings ({result['hours']:.2f} h), "
            f"{result['kept']} utterances kept, {result['dropped']} dropped "
            f"{result['dropped_by_reason'] or ''}; "
            f"{splits}"
        )


class Alignments(luigi.WrapperTask):
    """Every ``recordings`` corpus of a config's ``data.corpora``."""

    config = luigi.Parameter(description="Path of the YAML config file.")

    def requires(self):
        """An Align per ``recordings`` corpus (of every task of a multi-task config)."""
        from tasks.imports import corpus_tasks

        return corpus_tasks(self.config, "align", Align)
