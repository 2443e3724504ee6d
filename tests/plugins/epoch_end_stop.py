"""Training hooks of a test's own (``training.hooks: [tests.plugins.epoch_end_stop]``) that stop training at
an epoch's end, as a user's hook may (a target WER reached, a time budget spent).

``EPOCH_END_STOP`` = ``validation:N`` raises ``StopTraining`` from ``on_validation`` after epoch N,
``epoch:N`` from ``on_epoch`` after epoch N (1-based). Without the variable it does nothing.
"""

from __future__ import annotations

import os

from pipeline.train.hooks import StopTraining, TrainHooks


def TRAIN_HOOKS(config) -> TrainHooks:  # noqa: N802 - the plug-in attribute's name
    """The stop, when ``EPOCH_END_STOP`` is set; otherwise no hook."""
    wanted = os.environ.get("EPOCH_END_STOP", "")
    if not wanted:
        return TrainHooks()
    hook, epoch = wanted.split(":")

    def stop(info) -> None:
        if info.epoch == int(epoch):
            raise StopTraining(f"the {hook} hook stops training after epoch {epoch}")

    return TrainHooks(**{"on_validation" if hook == "validation" else "on_epoch": stop})
