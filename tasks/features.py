"""Features: validated corpus -> HDF5 feature cache, one task per split."""

from __future__ import annotations

import logging

import luigi

from pipeline.config_loader import load_config
from pipeline.dag import SPLITS
from pipeline.stages.features import features_stage
from tasks.base import ConfigParameter, ConfigTask, Progress, task_parameter

log = logging.getLogger("luigi-interface")


class FeaturesSplit(ConfigTask):
    """The feature cache of one split (train, dev or test); its path carries the Features fingerprint."""

    stage = "features"
    split = luigi.ChoiceParameter(choices=SPLITS, description="Which split to featurise.")
    task = task_parameter()

    def output(self):
        return luigi.LocalTarget(str(self.layout.features_cache(self.split)), format=luigi.format.Nop)

    def run_stage(self):
        name = f"{self.task} {self.split}" if self.task else self.split
        progress = Progress(self, total=1, unit="file", description=f"features {name}")

        def report(done, total, rejected, seconds):
            progress.bar.total = total
            progress.update(
                done,
                f"{self.split}: {done}/{total} files, {rejected} rejected, {seconds / 3600:.2f} h audio",
                force=done == total,
            )

        try:
            summary = features_stage(self.layout, self.split, report)
        finally:
            progress.close()
        converted = f"{summary.resampled} resampled, {summary.downmixed} downmixed"
        log.info(
            "Features %s: %d kept (%s), %d rejected %s, %.2f h audio; rejects report %s",
            self.split,
            summary.kept,
            converted,
            summary.rejected,
            summary.reasons,
            summary.audio_seconds / 3600,
            summary.rejects_report,
        )
        self.tell_scheduler(
            message=f"{self.split}: {summary.kept} kept ({converted}), {summary.rejected} rejected "
            f"{summary.reasons or ''}, {summary.audio_seconds / 3600:.2f} h audio"
        )


class Features(luigi.WrapperTask):
    """The feature caches of a config: train, and dev and test when the config lists their files; of every
    task of a multi-task config (or of ``--task``)."""

    config = ConfigParameter(description="Path of the YAML config file.")
    task = task_parameter()

    def requires(self):
        config = load_config(self.config)
        tasks = (self.task,) if self.task else config.tasks or ("",)
        return [
            FeaturesSplit(config=self.config, split=split, task=task)
            for task in tasks
            for split in SPLITS
            if split == "train" or (config.task_view(task) if task else config).has_split(split)
        ]
