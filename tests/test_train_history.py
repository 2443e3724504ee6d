"""The training history as typed records in real checkpoints, and the after-epoch policy's decisions."""

import json
import math

import pytest
import tensorflow as tf

from pipeline.config import Config, EarlyStopConfig, TrainingConfig
from pipeline.reports import DevFigures, ReportError, StopRecord
from pipeline.train.history import EpochLoss, HistoryState, SkippedBatch, TrainHistory
from pipeline.train.policy import EpochPolicy


def _history() -> TrainHistory:
    return TrainHistory(
        validations=[DevFigures(1, 5.0, 0.9, 0.5), DevFigures(2, 4.0, 0.8, 0.4)],
        last_samples={"best": [{"path": "a.wav"}], "worst": []},
        epoch_losses=[EpochLoss(1, 9.5), EpochLoss(2, 7.25)],
        skipped_batches=[SkippedBatch(3, ["x.wav", "y.wav"])],
        stop=StopRecord("patience", "no gain", 2),
    )


def test_the_history_is_saved_and_restored_with_the_checkpoint_as_typed_records(tmp_path):
    state = HistoryState(_history())
    step = tf.Variable(7, dtype=tf.int64)
    prefix = tf.train.Checkpoint(history=state, step=step).save(str(tmp_path / "ckpt"))
    assert dict(tf.train.list_variables(prefix))["history/.ATTRIBUTES/py_state"] == []
    state.history.validations.append(DevFigures(3, 1.0, 0.1, 0.1))  # changed after the save

    fresh = HistoryState()
    tf.train.Checkpoint(history=fresh, step=tf.Variable(0, dtype=tf.int64)).restore(prefix).assert_consumed()
    assert fresh.history == _history()
    assert isinstance(fresh.history.validations[0], DevFigures)
    assert isinstance(fresh.history.skipped_batches[0], SkippedBatch)
    assert fresh.history.stop == StopRecord("patience", "no gain", 2)


def test_a_checkpoint_with_the_old_untyped_history_restores_into_the_record(tmp_path):
    """Runs checkpointed before the typed record kept it as a JSON dict in a tf.string variable."""
    old = {
        "validations": [
            {"epoch": 1, "dev_loss": 5.0, "wer": 0.9, "cer": 0.5, "samples": {"best": [], "worst": []}},
            {"epoch": 2, "dev_loss": 4.0, "wer": 0.8, "cer": 0.4, "samples": {"best": [{"path": "a.wav"}]}},
        ],
        "epoch_losses": [{"epoch": 1, "train_loss": 9.5}],
        "skipped_batches": [{"step": 3, "files": ["x.wav"]}],
        "stop": None,
    }
    variable = tf.Variable(json.dumps(old), dtype=tf.string, trainable=False)
    prefix = tf.train.Checkpoint(history=variable).save(str(tmp_path / "old"))
    state = HistoryState()
    tf.train.Checkpoint(history=state).restore(prefix).expect_partial()
    assert state.history.validations == [DevFigures(1, 5.0, 0.9, 0.5), DevFigures(2, 4.0, 0.8, 0.4)]
    assert state.history.last_samples == {"best": [{"path": "a.wav"}]}
    assert state.history.epoch_losses == [EpochLoss(1, 9.5)]
    assert state.history.skipped_batches == [SkippedBatch(3, ["x.wav"])]
    assert state.history.stop is None


def test_a_malformed_history_names_the_field():
    text = _history().to_json().replace('"wer"', '"word_error_rate"')
    with pytest.raises(
        ReportError, match=r"validations\[0\]: not a DevFigures: unknown field\(s\) word_error"
    ):
        TrainHistory.from_json(text, "checkpoint")
    with pytest.raises(ReportError, match="format 9 is newer"):
        TrainHistory.from_json(json.dumps({"format": 9}), "checkpoint")


def test_a_nan_dev_loss_is_never_the_best():
    history = TrainHistory(validations=[DevFigures(1, math.nan, 1.0, 1.0)])
    assert history.best() is None and history.best_dev_loss() == math.inf
    history.validations += [DevFigures(2, 6.0, 0.9, 0.5), DevFigures(3, 5.5, 0.8, 0.4)]
    assert history.best() == DevFigures(3, 5.5, 0.8, 0.4)


def _policy(has_dev=True, **training) -> EpochPolicy:
    config = Config(
        training=TrainingConfig(**training),
        early_stop=EarlyStopConfig(rule="patience", es_epochs=1, es_min_delta=0.5),
    )
    return EpochPolicy(config, has_dev)


def test_the_policy_decides_best_plateau_halving_and_stop_from_the_history():
    history = TrainHistory(validations=[DevFigures(1, 5.0, 0.9, 0.5)])
    calls = []

    def validate(loss):
        def run(epoch):
            calls.append(epoch)
            return DevFigures(epoch, loss, 0.5, 0.2), {"best": [], "worst": []}

        return run

    policy = _policy(halve_lr_on_plateau=True, validation_epochs=2)
    assert policy.after_epoch(3, history, validate(1.0)).validation is None and calls == []
    better = policy.after_epoch(2, history, validate(4.0))
    assert better.is_best and not better.halve_lr and better.best_before == 5.0
    assert better.stop is None  # 4.0 improves on 5.0 by more than es_min_delta 0.5
    worse = policy.after_epoch(4, history, validate(5.2))
    assert not worse.is_best and worse.halve_lr
    assert worse.stop == StopRecord("patience", worse.stop.reason, 4) and "0.5" in worse.stop.reason
    assert history.validations == [DevFigures(1, 5.0, 0.9, 0.5)]  # the policy only decides
    nan = policy.after_epoch(2, TrainHistory(), validate(math.nan))
    assert not nan.is_best and nan.best_before == math.inf


def test_best_by_cer_keeps_the_lowest_error_rate_while_halving_still_reads_the_loss():
    """training.best_by: cer: a validation whose dev loss rose but whose CER fell is the new best (the
    checkpoint Evaluate uses), the plateau rule still halves on the risen loss; a NaN CER or loss is never
    best."""
    history = TrainHistory(validations=[DevFigures(1, 30.0, 0.6, 0.25), DevFigures(2, 32.0, 0.5, 0.2)])
    assert history.best().epoch == 1 and history.best("cer").epoch == 2 and history.best("wer").epoch == 2
    policy = _policy(halve_lr_on_plateau=True, best_by="cer")

    def validate(loss, cer):
        return lambda epoch: (DevFigures(epoch, loss, 0.5, cer), {"best": [], "worst": []})

    lower_cer = policy.after_epoch(3, history, validate(33.0, 0.18))
    assert lower_cer.is_best and lower_cer.halve_lr and lower_cer.best_before == 30.0
    assert not policy.after_epoch(3, history, validate(29.0, 0.21)).is_best
    assert not policy.after_epoch(3, history, validate(29.0, 0.2)).is_best  # the earlier of equals
    assert not policy.after_epoch(3, history, validate(29.0, math.nan)).is_best
    assert not policy.after_epoch(1, TrainHistory(), validate(math.nan, 0.5)).is_best  # a NaN loss: never
    assert policy.after_epoch(1, TrainHistory(), validate(50.0, 0.5)).is_best


def test_the_policy_warns_when_validation_cannot_happen():
    assert _policy().blind_spots() == []
    blind = _policy(has_dev=False, halve_lr_on_plateau=True).blind_spots()
    assert [w.split(":")[0] for w in blind] == [
        "data.dev_files is empty",
        "early_stop.rule is 'patience' but data.dev_files is empty",
        "training.halve_lr_on_plateau is on but data.dev_files is empty",
    ]
    assert not _policy(has_dev=False).validation_due(1)
    off = _policy(validation_epochs=0).blind_spots()
    assert off == [
        "early_stop.rule is 'patience' but validation is off (training.validation_epochs: 0): "
        "no early stopping"
    ]


def test_a_non_finite_stop_record_holds_until_the_limit_is_raised(tmp_path, caplog):
    """Issue 42 G7: the record a training.max_nonfinite_batches stop leaves in the run: the same or a lower
    limit raises its very line again; a higher one goes on with a warning, the chief removing the record (a
    non-chief worker leaves it to the chief); a damaged record is one line naming the file."""
    from pipeline.train.checkpointing import TrainingError
    from pipeline.train.nonfinite_stop import check_not_stopped, record_stop, stop_message
    from pipeline.workdir import TrainRun

    run = TrainRun(tmp_path / "run")
    check_not_stopped(run, 10, is_chief=True)  # no record: nothing to say
    message = stop_message(10, ["a.wav", "b.wav"], 0.001, 420)
    assert "\n" not in message and "raise training.max_nonfinite_batches above 10" in message
    record_stop(run, 10, 420, message)
    for limit in (10, 3):
        with pytest.raises(TrainingError) as error:
            check_not_stopped(run, limit, is_chief=True)
        assert str(error.value) == message
    with caplog.at_level("WARNING"):
        check_not_stopped(run, 11, is_chief=False)
    assert run.nonfinite_stop.is_file() and "above the 10 that stopped this run at step 420" in caplog.text
    check_not_stopped(run, 11, is_chief=True)
    assert not run.nonfinite_stop.exists()

    run.nonfinite_stop.write_text("{not json")
    with pytest.raises(TrainingError, match=f"^{run.nonfinite_stop}: a damaged record") as error:
        check_not_stopped(run, 11, is_chief=True)
    assert "\n" not in str(error.value)
