"""Issue 34 item 5 with tasks: ``training.accumulate_batches`` over a multi-task run's steps. A window of
N round_robin steps at batch B trains what one step at batch N x B does; a run stopped inside a window
saves at its end and resumes every task exactly (towers: test_multitask_train)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from pipeline.layout import Layout
from pipeline.stages.train import train_stage
from pipeline.train.hooks import StepInfo, StopTraining, TrainHooks
from pipeline.train.tasks import schedule_lengths, task_windows
from tests.test_multitask_train import _stored, two_tasks


def _sizes(table):
    return lambda task, draw: table[task][draw]


def test_one_task_windows_are_the_single_task_windows():
    """One task: each batch's coefficient is 1 over its window's utterances, as a single-task run's
    windows weigh them (``plan_windows``: test_accumulate)."""
    windows = task_windows([(0,)] * 5, [0], _sizes({0: [4, 4, 3, 4, 2]}), [1.0], schedule_lengths(5, 2))
    assert windows.coefficients == ((1 / 8,),) * 2 + ((1 / 7,),) * 2 + ((1 / 2,),)
    assert windows.ends == frozenset({2, 4, 5})
    assert windows.shares == pytest.approx([0.5, 0.5, 3 / 7, 4 / 7, 1.0])


def test_a_window_pools_each_tasks_utterances_and_weighs_the_task_by_its_steps():
    """proportional (a step draws one task): in a window of 3 steps, en drawn twice (batches of 4 and 2
    utterances, factor 1.5) and fr once (3 utterances, factor 0.5): en's batches weigh 1.5 x 2/3 over its
    6 utterances, fr's 0.5 x 1/3 over its 3; the draws go on from where each task was."""
    schedule = [(0,), (1,), (0,), (1,)]
    sizes = {0: [9, 9, 4, 2], 1: [3, 5]}
    windows = task_windows(schedule, [2, 0], _sizes(sizes), [1.5, 0.5], schedule_lengths(4, 3))
    en, fr = 1.5 * 2 / (3 * 6), 0.5 * 1 / (3 * 3)
    assert [c for (c,) in windows.coefficients[:3]] == pytest.approx([en, fr, en])
    assert windows.coefficients[3] == (0.5 / 5,)  # a window of one step: fr's second batch alone
    mass = [en * 4, fr * 3, en * 2]
    assert windows.shares[:3] == pytest.approx([m / sum(mass) for m in mass])
    # round_robin: every step draws both tasks; a window of 2 steps is one step of twice the batch
    windows = task_windows([(0, 1)] * 2, [0, 0], _sizes({0: [4, 4], 1: [2, 2]}), [1.0, 1.0], [2])
    assert windows.coefficients == ((1 / 16, 1 / 8),) * 2


def test_round_robin_windows_of_two_batches_of_2_train_what_batches_of_4_do(tmp_path):
    """Towers off, float32, dropout 0, two tasks (en 8 train rows, fr 4), round_robin: batch 2 with
    accumulate_batches 2 ends with the weights of batch 4 after 4 updates, to float rounding."""
    multitask = "sampling: round_robin\n"
    common = "training: {epochs: 2, dev_batch_size: 8, report_count: 1, validation_epochs: 0, "
    small = two_tasks(
        tmp_path, "small.yaml", "small", multitask, extra=common + "batch_size: 2, accumulate_batches: 2}\n"
    )
    big = two_tasks(tmp_path, "big.yaml", "big", multitask, extra=common + "batch_size: 4}\n")
    small_report = train_stage(Layout(small))
    big_report = train_stage(Layout(big))
    assert (small_report.global_step, small_report.updates) == (8, 4)
    assert (big_report.global_step, big_report.updates) == (4, 4)
    assert [t["batches_drawn"] for t in small_report.tasks] == [8, 8]
    small_weights = _stored(tf.train.latest_checkpoint(str(Layout(small).train_run.checkpoints)))
    big_weights = _stored(tf.train.latest_checkpoint(str(Layout(big).train_run.checkpoints)))
    assert set(small_weights) == set(big_weights) and "heads.fr.kernel" in small_weights
    for name, value in big_weights.items():
        # float rounding differs between CPUs (AVX2 5.6e-5, AVX-512 under 2e-5); a window of the wrong
        # batches moves a weight by about the learning rate (1e-3)
        assert abs(small_weights[name] - value).max() < 2e-4, name
    # and the windows were not a no-op: weights moved from the start
    assert abs(small_weights["heads.fr.kernel"]).sum() > 0
    for small_epoch, big_epoch in zip(small_report.train_losses, big_report.train_losses, strict=True):
        assert small_epoch["train_loss"] == pytest.approx(big_epoch["train_loss"], rel=1e-4)


def _stop_at(step: int, seen: list) -> TrainHooks:
    def on_step(info: StepInfo) -> None:
        seen.append(info.step)
        if info.step == step:
            raise StopTraining("asked")

    return TrainHooks(on_step=on_step)


@pytest.mark.long
@pytest.mark.slow
def test_a_stop_inside_a_window_saves_at_its_end_and_resumes_every_task_exactly(tmp_path):
    """proportional, batch 2, windows of 2 steps (en 4 batches, fr 2: 6 steps, 3 updates an epoch): a hook
    stops training after step 3, inside the window of steps 3 and 4; the trainer runs step 4 and saves
    there with the tasks' positions; the resumed run ends with the weights of a run never stopped."""
    extra = (
        "training: {epochs: 2, batch_size: 2, accumulate_batches: 2, dev_batch_size: 8, report_count: 1, "
        "checkpoint_secs: 100000}\n"
    )
    stopped = two_tasks(tmp_path, "stopped.yaml", "stopped", extra=extra)
    layout = Layout(stopped)
    seen = []
    with pytest.raises(StopTraining, match="asked"):
        train_stage(layout, hooks=_stop_at(3, seen))
    assert seen == [1, 2, 3, 4]
    checkpoints = layout.train_run.checkpoints
    assert sorted(p.name for p in checkpoints.glob("ckpt-*.index")) == ["ckpt-4.index"]
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(checkpoints)))
    assert sum(reader.get_tensor("task_batches/.ATTRIBUTES/VARIABLE_VALUE").tolist()) == 4
    resumed = train_stage(layout)
    assert (resumed.global_step, resumed.updates) == (12, 6)
    assert [t["batches_drawn"] for t in resumed.tasks] == [8, 4]
    clean = train_stage(Layout(two_tasks(tmp_path, "clean.yaml", "clean", extra=extra)))
    assert resumed.weights_sha256 == clean.weights_sha256


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_non_finite_batch_of_a_task_is_skipped_and_named(tmp_path, accumulate):
    """One en utterance with NaN features, batch 1: its step is logged and reported as skipped with its
    file; in windows of 2 steps the window's other step still makes the update; with
    training.max_nonfinite_batches 1 the run stops with a one-line error naming the file."""
    import dataclasses
    import shutil

    import h5py
    import numpy as np

    from pipeline.features.cache import read_cache
    from pipeline.stages.train import task_data
    from pipeline.train.checkpointing import TrainingError
    from pipeline.train.distribute import make_strategy
    from pipeline.train.loop import Trainer

    extra = (
        f"training: {{epochs: 1, batch_size: 1, accumulate_batches: {accumulate}, validation_epochs: 0, "
        "dev_batch_size: 8, report_count: 1}\n"
    )
    config = two_tasks(tmp_path, extra=extra)
    layout = Layout(config)
    tasks = task_data(layout)
    cache = layout.for_task("en").features_cache("train")
    poisoned = int(np.argmax(tasks[0].train.lengths))
    copy = tmp_path / "poisoned.h5"
    shutil.copyfile(cache, copy)
    with h5py.File(copy, "r+") as h5:
        h5["features"][tasks[0].train.offsets[poisoned] : tasks[0].train.offsets[poisoned] + 5] = np.nan
    tasks[0] = dataclasses.replace(tasks[0], train=read_cache(copy, config.features))
    file = tasks[0].train.paths[poisoned]
    strategy = make_strategy(config.distribution)
    trainer = Trainer(config, tmp_path / "run", tasks, strategy)
    report = trainer.fit()
    assert [b["files"] for b in report.skipped_batches] == [[file]]
    assert (report.global_step, report.updates) == (12, 12 // accumulate)
    assert int(trainer.optimizer.iterations.numpy()) == (11 if accumulate == 1 else 6)
    assert all(np.all(np.isfinite(w.numpy())) for w in trainer.model.weights)

    strict = dataclasses.replace(
        config, training=dataclasses.replace(config.training, max_nonfinite_batches=1)
    )
    with pytest.raises(TrainingError) as error:
        Trainer(strict, tmp_path / "strict", tasks, strategy).fit()
    assert file in str(error.value) and "\n" not in str(error.value)


def test_a_task_drawn_only_in_a_skipped_step_of_a_window_is_not_moved(tmp_path):
    """proportional, batch 1, windows of 2 steps: fr's batch in a window whose other step is en's has NaN
    features (after fr has had an update, so Adam holds momentum for its head). The window's update moves
    the encoder and en's head, never fr's head: a zero gradient would still move it through Adam."""
    import dataclasses
    import shutil

    import h5py
    import numpy as np

    from pipeline.batches.dataset import epoch_batches
    from pipeline.features.cache import read_cache
    from pipeline.stages.train import task_data
    from pipeline.train.distribute import make_strategy
    from pipeline.train.loop import Trainer

    extra = (
        "training: {epochs: 1, batch_size: 1, accumulate_batches: 2, validation_epochs: 0, "
        "dev_batch_size: 8, report_count: 1}\n"
    )
    config = two_tasks(tmp_path, extra=extra)
    tasks = task_data(Layout(config))
    strategy = make_strategy(config.distribution)
    probe = Trainer(config, tmp_path / "probe", tasks, strategy)
    schedule = probe.inputs.epoch_tasks(0)
    windows = [schedule[start : start + 2] for start in range(0, len(schedule), 2)]
    # the first window of one fr step and one en step after a window that trained fr
    trained_fr, chosen = False, None
    for number, window in enumerate(windows):
        if trained_fr and sorted(window) == [(0,), (1,)]:
            chosen = number
            break
        trained_fr = trained_fr or (1,) in window
    assert chosen is not None, schedule
    draw = sum(tasks == (1,) for tasks in schedule[: 2 * chosen + windows[chosen].index((1,))])
    order = epoch_batches(probe.inputs.plans[1], 0, probe.inputs.seed(1), 2)
    (poisoned,) = order[draw]
    copy = tmp_path / "poisoned.h5"
    shutil.copyfile(Layout(config).for_task("fr").features_cache("train"), copy)
    fr = tasks[1].train
    with h5py.File(copy, "r+") as h5:
        h5["features"][fr.offsets[poisoned] : fr.offsets[poisoned] + 5] = np.nan
    tasks[1] = dataclasses.replace(tasks[1], train=read_cache(copy, config.features))

    held, after = [], {}

    def on_step(info: StepInfo) -> None:
        model = held[0].model
        after[info.step] = {
            "fr": [w.numpy().copy() for w in model.head(1).weights],
            "en": [w.numpy().copy() for w in model.head(0).weights],
        }

    trainer = Trainer(config, tmp_path / "run", tasks, strategy, hooks=TrainHooks(on_step=on_step))
    held.append(trainer)
    report = trainer.fit()
    assert [b["files"] for b in report.skipped_batches] == [[fr.paths[poisoned]]]
    before, end = after[2 * chosen], after[2 * chosen + 2]
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before["en"], end["en"], strict=True))
    for name, (a, b) in zip(("kernel", "bias"), zip(before["fr"], end["fr"], strict=True), strict=True):
        assert np.array_equal(a, b), f"fr's head {name} moved in a window whose fr batch was skipped"
