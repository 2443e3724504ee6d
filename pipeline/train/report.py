"""The training report (``train_report.json``) of a run, as its trainer ends."""

from __future__ import annotations

import dataclasses
import time

from pipeline.model.weights import weights_digest
from pipeline.reports import StopRecord, TrainReport, report_to_dict


def train_report(trainer, target: int, wall_this_run: float) -> TrainReport:
    """The whole ``train_report.json`` of ``trainer``'s run (a ``loop.Trainer``; the only place it is
    built): its position, figures, checkpoints and data; ``target`` epochs, ``wall_this_run`` seconds of
    this process."""
    history = trainer.history
    stop = history.stop or StopRecord(rule=None, reason=f"reached the target of {target} epochs")
    positions = trainer.inputs.positions.numpy()
    tasks = [
        {
            "name": task.name,
            "weight": task.weight,
            "loss_factor": factor,
            "train_samples": len(task.train),
            "train_audio_hours": float(task.train.durations.sum()) / 3600,
            "batches_per_round": size,
            "batches_drawn": int(drawn),
        }
        for task, factor, size, drawn in zip(
            trainer.tasks, trainer.inputs.factors, trainer.inputs.sizes, positions, strict=True
        )
    ]
    return TrainReport(
        epochs_completed=int(trainer.state.epoch.numpy()),
        target_epochs=target,
        global_step=int(trainer.state.global_step.numpy()),
        updates=int(trainer.state.updates.numpy()),
        accumulate_batches=trainer.config.training.accumulate_batches,
        deterministic_ops={1: True, 0: False}.get(int(trainer.state.deterministic_ops.numpy())),
        steps_per_epoch=trainer.steps_per_epoch,
        towers=trainer.towers,
        batch_size_per_tower=trainer.per_tower_batch,
        global_batch_size=trainer.global_batch,
        train_losses=[dataclasses.asdict(e) for e in history.epoch_losses],
        validations=[report_to_dict(v) for v in history.validations],
        best_dev=history.best(trainer.config.training.best_by),
        last_samples=history.last_samples,
        stop=stop,
        skipped_batches=[dataclasses.asdict(b) for b in history.skipped_batches],
        best_checkpoint=trainer.checkpoints.best_manager.latest_checkpoint,
        latest_checkpoint=trainer.checkpoints.manager.latest_checkpoint,
        wall_time_s_this_run=wall_this_run,
        epochs_setting=trainer.config.training.epochs,
        weights_sha256=weights_digest(trainer.model),
        fingerprint=trainer.fingerprint,
        config=trainer.config.source,
        train_samples=sum(task["train_samples"] for task in tasks),
        train_audio_hours=sum(task["train_audio_hours"] for task in tasks),
        tasks=tasks if trainer.inputs.several else None,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        wall_time_s=time.time() - trainer.started,
    )
