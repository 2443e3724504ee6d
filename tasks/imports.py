"""Import: a corpus of ``data.corpora`` in its own layout -> train/dev/test manifests, a task per corpus."""

from __future__ import annotations

import luigi

from tasks.base import ConfigTask, Progress, task_parameter


class Import(ConfigTask):
    """The import of one corpus (``--corpus``: its key, ``data.corpora[].name`` or ``<importer>-<folder
    name>``); output: its ``report.json``, the manifests, rejects beside it, in a folder named by the
    Import fingerprint (the importer's settings and the corpus files' names, sizes and modification times)."""

    stage = "import"
    corpus = luigi.Parameter(
        description="The corpus's key (data.corpora[].name, default <importer>-<folder name>)."
    )
    task = task_parameter()

    def output(self):
        """The import's ``report.json`` (written last)."""
        return luigi.LocalTarget(str(self.layout.import_files(self.corpus).report))

    def stage_complete(self):
        """Whether the import folder holds every file its report recorded, at the recorded size."""
        from pipeline.stages.imports import import_intact

        # Stats only: the report and each file it recorded, at the size it recorded.
        return import_intact(self.layout.import_files(self.corpus))

    def run_stage(self):
        """Import the corpus, the progress and a summary shown in the Luigi UI."""
        from pipeline.stages.imports import import_stage

        progress = Progress(self, total=100, unit="%", description=f"import {self.corpus}")

        def report(read, kept, dropped, fraction):
            progress.update(
                round(100 * fraction),
                f"{self.corpus}: {read} rows read, {kept} kept, {dropped} dropped",
                percent=100 * fraction,
                force=fraction >= 1.0,
            )

        try:
            result = import_stage(self.layout, self.corpus, report)
        finally:
            progress.close()
        splits = ", ".join(
            f"{split} {s['utterances']} ({s['hours']:.2f} h, {s['speakers']} speakers)"
            for split, s in result["splits"].items()
        )
        self.tell_scheduler(percent=100)
        self.tell_scheduler(
            message=f"{self.corpus}: {result['kept']} kept, {result['dropped']} dropped "
            f"{result['dropped_by_reason'] or ''}; {splits}"
        )


class Imports(luigi.WrapperTask):
    """Every corpus of a config's ``data.corpora``."""

    config = luigi.Parameter(description="Path of the YAML config file.")

    def requires(self):
        """An Import per ``data.corpora`` entry (of every task of a multi-task config)."""
        return corpus_tasks(self.config, "import", Import)


def corpus_tasks(config_path: str, name: str, task_class) -> list:
    """A ``task_class`` per instance of stage ``name`` over the corpora of every task of a config."""
    from pipeline.config_loader import load_config
    from pipeline.dag import instances, stage, task_config

    config = load_config(config_path)
    keys = dict.fromkeys(
        corpus.key
        for task in config.tasks or ("",)
        for corpus in task_config(config, {"task": task}).data.corpora
    )
    return [
        task_class(config=config_path, **params)
        for key in keys
        for params in instances(config, stage(name), {"corpus": key})
    ]
