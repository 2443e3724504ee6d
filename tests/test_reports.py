"""Typed stage reports: one reader and one writer, loud on a renamed field or a damaged file."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline.reports import (
    DevFigures,
    ExportRecord,
    LMReport,
    ReportError,
    StopRecord,
    TrainReport,
    read_report,
    write_report,
)
from pipeline.train.epochs import RunRecord, epoch_target, training_done


def _train_report(**changes) -> TrainReport:
    report = TrainReport(
        epochs_completed=3,
        target_epochs=3,
        global_step=30,
        steps_per_epoch=10,
        towers=1,
        batch_size_per_tower=4,
        global_batch_size=4,
        train_losses=[],
        validations=[],
        best_dev=DevFigures(epoch=2, dev_loss=1.5, wer=0.4, cer=0.2),
        last_samples=None,
        stop=StopRecord(rule=None, reason="reached the target of 3 epochs"),
        skipped_batches=[],
        best_checkpoint="best-20",
        latest_checkpoint="ckpt-30",
        wall_time_s_this_run=1.0,
    )
    return dataclasses.replace(report, **changes)


def test_a_report_reads_back_as_written(tmp_path):
    path = tmp_path / "train_report.json"
    write_report(path, _train_report())
    assert read_report(path, TrainReport) == _train_report()
    assert json.loads(path.read_text())["best_dev"] == {"epoch": 2, "dev_loss": 1.5, "wer": 0.4, "cer": 0.2}


def test_a_renamed_field_fails_instead_of_reading_as_null(tmp_path):
    path = tmp_path / "train_report.json"
    write_report(path, _train_report())
    data = json.loads(path.read_text())
    data["best"] = data.pop("best_dev")
    path.write_text(json.dumps(data))
    with pytest.raises(
        ReportError,
        match=r"train_report\.json: not a TrainReport: unknown field\(s\) best; "
        r"missing field\(s\) best_dev",
    ):
        read_report(path, TrainReport)
    data.pop("best")
    data["best_dev"] = {"epoch": 1, "loss": 2.0, "wer": 0.5, "cer": 0.3}
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match="best_dev: not a DevFigures"):
        read_report(path, TrainReport)


def test_a_damaged_report_is_one_line_naming_the_file_and_the_remedy(tmp_path):
    path = tmp_path / "lm_report.json"
    path.write_text('{"fingerprint": "abc", "ord')
    with pytest.raises(ReportError) as error:
        read_report(path, LMReport)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and "make rerun STAGE=LanguageModel" in message
    with pytest.raises(ReportError, match="does not exist; run the Export task"):
        read_report(tmp_path / "metadata.json", ExportRecord)


def test_the_export_record_holds_every_key_the_client_requires():
    from native_client.metadata import REQUIRED_KEYS

    assert set(REQUIRED_KEYS) <= {f.name for f in dataclasses.fields(ExportRecord)}


def test_the_epoch_target_rule():
    def run(done, target, setting, finished=True, stopped=False):
        return RunRecord(epochs_done=done, target=target, setting=setting, finished=finished, stopped=stopped)

    assert epoch_target(10, None) == 10 and epoch_target(-3, None) == 3  # a new run
    assert epoch_target(10, run(4, 6, 6, finished=False)) == 10
    assert epoch_target(-2, run(4, 4, 4)) == 6  # two more than the checkpoint has
    assert epoch_target(-2, run(5, 6, -2, finished=False)) == 6  # a restarted "-2 more" run keeps its target
    assert epoch_target(-2, run(6, 6, -2)) == 6  # ... and once finished, the same -2 adds nothing
    assert epoch_target(-3, run(6, 6, -2)) == 9  # a new value adds its own N
    assert epoch_target(-2, run(5, 6, None, finished=False)) == 6  # a killed run from older code
    assert epoch_target(-2, run(6, 6, None)) == 8  # a finished run from older code: N more
    assert epoch_target(20, run(3, 9, 9, stopped=True)) == 9  # an early stop is final
    assert training_done(3, _train_report(epochs_setting=3))
    assert not training_done(5, _train_report(epochs_setting=3))
    assert training_done(-2, _train_report(epochs_setting=-2))  # the "-2 more" run that wrote it has finished
    assert not training_done(-2, _train_report(epochs_setting=3))  # a run to 3: "-2 more" trains (M1)
    assert not training_done(-2, _train_report(epochs_completed=2, epochs_setting=-2))
    assert training_done(9, _train_report(stop=StopRecord(rule="patience", reason="no gain", epoch=3)))
    assert training_done(-2, _train_report(stop=StopRecord(rule="patience", reason="no gain", epoch=3)))
