"""The reports stages write and later stages read, as dataclasses with one reader and one writer.

A report is written by ``write_report`` and read by ``read_report``, which
refuses a field it does not know and one it misses, so a renamed key fails
loudly instead of turning into ``null`` downstream. A damaged or partial
report gives one error naming the file and how to redo the stage.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pipeline.files import write_json_atomic

R = TypeVar("R")


class ReportError(ValueError):
    """A stage's report is missing, damaged or of another shape; the message names the file."""


def omitted_when_none():
    """A field a report writes only when it has a value (a multi-task run's figures per task): the reports
    of a single-task run stay as they were, and read back with it None."""
    return dataclasses.field(default=None, metadata={"omitted_when_none": True})


def report_to_dict(report) -> dict:
    """A report dataclass as plain data (``dataclasses.asdict``), without its ``omitted_when_none`` fields
    that are None, in nested reports too."""

    def plain(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return report_to_dict(value)
        if isinstance(value, (list, tuple)):
            return type(value)(plain(item) for item in value)
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        return copy.deepcopy(value)

    return {
        f.name: plain(getattr(report, f.name))
        for f in dataclasses.fields(report)
        if not (f.metadata.get("omitted_when_none") and getattr(report, f.name) is None)
    }


@dataclass(frozen=True)
class DevFigures:
    """Dev-set figures of one validation."""

    epoch: int
    dev_loss: float
    wer: float
    cer: float
    # A multi-task run's figures per task ({task: {dev_loss, wer, cer}}); the fields above are then the
    # tasks' weighted mean. None (not written) for a single-task run.
    tasks: dict | None = omitted_when_none()

    def of_task(self, task: str) -> DevFigures | None:
        """These figures as task ``task`` of a multi-task run measured them in this validation (itself for
        ``""``); None when that task was not validated (no dev split)."""
        if not task:
            return self
        figures = (self.tasks or {}).get(task)
        if figures is None:
            return None
        return DevFigures(self.epoch, figures["dev_loss"], figures["wer"], figures["cer"])


@dataclass(frozen=True)
class StopRecord:
    """Why training ended: ``rule`` is the early-stop rule that stopped it,
    None when it reached its target."""

    rule: str | None
    reason: str
    epoch: int | None = None


@dataclass(frozen=True)
class TrainReport:
    """``train_report.json``: where a Train run ended, its dev history and its checkpoints."""

    STAGE: ClassVar[str] = "Train"

    epochs_completed: int
    target_epochs: int
    global_step: int
    steps_per_epoch: int
    towers: int
    batch_size_per_tower: int
    global_batch_size: int
    train_losses: list
    validations: list
    best_dev: DevFigures | None
    last_samples: dict | None
    stop: StopRecord
    skipped_batches: list
    best_checkpoint: str | None
    latest_checkpoint: str | None
    wall_time_s_this_run: float
    # The ``training.epochs`` this run trained for (negative: "that many more"); None in reports written
    # before it was recorded. With it a finished "-N more" run is told apart from a run that was given
    # an absolute target (``pipeline.train.epochs``).
    epochs_setting: int | None = None
    weights_sha256: str = ""
    fingerprint: str = ""
    config: str = ""
    train_samples: int = 0
    train_audio_hours: float = 0.0
    finished_at: str = ""
    wall_time_s: float = 0.0
    # Optimizer updates (``training.accumulate_batches`` batches each; one per step without it).
    updates: int | None = None
    accumulate_batches: int = 1
    # Whether every session that trained this run had TensorFlow's op determinism on
    # (``training.deterministic``); None in reports written before it was recorded, and for a run
    # resumed from a checkpoint written before.
    deterministic_ops: bool | None = None
    # A multi-task run's tasks: name, weight, loss factor, train samples and hours, batches per round of its
    # plan and batches drawn (train_samples and train_audio_hours are then their sums); None otherwise.
    tasks: list | None = omitted_when_none()


@dataclass(frozen=True)
class AlphabetReport:
    """``alphabet_report.json``: what the Alphabet stage read and built (``paths.alphabet: auto``)."""

    STAGE: ClassVar[str] = "Alphabet"

    fingerprint: str
    labels: int
    sha256: str  # of alphabet.txt, checked whenever a stage loads it
    rows: int
    rows_rejected: dict  # rows whose transcript normalised to nothing, by reason
    min_count: int
    characters: list  # [{char, codepoint, name, count}] in label order
    dropped: list  # [{char, codepoint, name, count, rows}]: seen fewer than min_count times
    rows_lost: int  # rows holding a dropped character (Features rejects them)
    rows_lost_examples: list  # the first few of them, as file:line
    text: dict  # the data.text settings the transcripts were normalised with
    wall_time_s: float = 0.0


@dataclass(frozen=True)
class PhonemesReport:
    """``phonemes_report.json``: the IPA manifests of a ``targets: phonemes`` task."""

    STAGE: ClassVar[str] = "Phonemes"

    fingerprint: str
    of: str  # the task whose audio and transcripts were read
    voice: str
    espeak: str  # espeak-ng's version
    rows: dict  # {split: rows written}
    empty: dict  # {split: rows whose transcript gave no phonemes (Features rejects them)}
    wall_time_s: float = 0.0


@dataclass(frozen=True)
class LMReport:
    """``lm_report.json``: what the LanguageModel stage read and built."""

    STAGE: ClassVar[str] = "LanguageModel"

    fingerprint: str
    order: int
    lm: str
    vocabulary: int
    vocabulary_source: str
    held_out_overlap: int
    wall_time_s: float
    corpus_lines: int = 0
    sentences: int = 0
    empty_lines: int = 0
    train_transcripts: int = 0
    ngrams: dict | None = None
    discounts: dict | None = None
    discount_fallback_orders: list | None = None
    char_lm: str | None = None
    builder: str = "python"
    # {file name in the stage directory: {"size", "mtime_ns", "sha256"}} of what the stage wrote
    files: dict | None = None


@dataclass(frozen=True)
class TunedPair:
    """The best alpha/beta of a tuning run and its dev figures."""

    lm_alpha: float
    lm_beta: float
    wer: float
    cer: float


@dataclass(frozen=True)
class TuneReport:
    """``tune.json``: the best alpha/beta, the greedy baseline and every trial."""

    STAGE: ClassVar[str] = "TuneDecoder"

    best: TunedPair
    greedy: dict
    search: dict
    trials: list
    wall_time_s: float


@dataclass(frozen=True)
class EvaluationReport:
    """``evaluation.json``: test-set figures, greedy and (``*_lm``) with beam search and the LM."""

    STAGE: ClassVar[str] = "Evaluate"

    wer: float
    cer: float
    loss: float
    samples_count: int
    checkpoint: str
    decoder: str
    samples: dict
    # Every utterance's result, one JSON line each, in a file beside the report (not in it: a report of a
    # 100-hour test set would hold ~600 MB of them, and so would Evaluate's memory).
    samples_file: str
    wer_lm: float | None = None
    cer_lm: float | None = None
    # wer, or cer where the language writes no spaces between words (pipeline.evaluation.metrics)
    headline: str = "wer"
    decoder_lm: dict | None = None
    decode_lm_s: float | None = None
    samples_lm: dict | None = None
    samples_lm_file: str | None = None
    # With export.average: the checkpoints averaged (``pipeline.model.averaging.Averaging.to_dict``), the
    # average's dev figures (``dev``: loss, wer, cer) and the single best-dev checkpoint's (``best_dev``).
    average: dict | None = None
    # greedy figures of the full-context computation, for a family whose inference is chunked (wer and cer
    # are then the chunked computation's, what the export runs); None for the others
    wer_full_context: float | None = None
    cer_full_context: float | None = None


@dataclass(frozen=True)
class ExportRecord:
    """An export's ``metadata.json`` as the Export stage writes it (``native_client.metadata`` reads it)."""

    STAGE: ClassVar[str] = "Export"

    format: str
    format_version: int
    model_version: int
    created_at: str
    fingerprint: str
    train_fingerprint: str
    checkpoint: str
    config: str
    global_step: int | None
    best_dev: DevFigures | None
    architecture: str
    features: dict
    n_context: int
    n_input: int
    n_steps: int
    n_classes: int
    alphabet: list
    files: dict
    tensors: dict
    tflite_quantized: bool
    frozen_graph: dict | None = None
    decoder: dict | None = None
    output: str = "characters"  # or bytes: UTF-8 byte labels (format 3)
    text: dict | None = None  # the data.text settings the client applies (format 3)
    card: dict | None = None  # the model card (pipeline.export.model_card; MODEL_CARD.md renders it)
    stride: int = 1  # feature frames per output label (format 4)
    # what one streaming call takes (format 4): input (windows or frames), chunk, context, lookahead,
    # lookback; None for a family without a streaming form (the export holds the utterance signature only)
    streaming: dict | None = None
    # the task of a multi-task config this export is of (its head, alphabet, LM); not written otherwise
    task: str | None = omitted_when_none()
    # format 6: "global" when the graph normalises the features (``features.normalize: global``, the
    # statistics weights of the model); not written otherwise
    normalization: str | None = omitted_when_none()
    # format 7: a transducer's predictor and joiner (``pipeline.export.inference_graph.transducer_entry``);
    # not written for a CTC model, whose export stays format 6
    transducer: dict | None = omitted_when_none()


def _dataclass_of(tp) -> type | None:
    """The dataclass a field holds (directly or as Optional), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            return inner[0]
    return None


def _list_of_dataclass(tp) -> type | None:
    """The dataclass of a ``list[SomeDataclass]`` field, else None."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list and len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def report_from_dict(cls: type[R], data: Any, where: str) -> R:
    """Build report ``cls`` from plain data; ReportError names ``where`` and the unknown or missing fields."""
    if not isinstance(data, dict):
        raise ReportError(f"{where}: expected a JSON object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    missing = [
        name
        for name, f in fields.items()
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if unknown or missing:
        problems = ([f"unknown field(s) {', '.join(unknown)}"] if unknown else []) + (
            [f"missing field(s) {', '.join(missing)}"] if missing else []
        )
        raise ReportError(f"{where}: not a {cls.__name__}: {'; '.join(problems)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in data.items():
        nested, items = _dataclass_of(hints[name]), _list_of_dataclass(hints[name])
        if nested and value is not None:
            value = report_from_dict(nested, value, f"{where}: {name}")
        elif items:
            if not isinstance(value, list):
                raise ReportError(f"{where}: {name}: expected a list, got {type(value).__name__}")
            value = [report_from_dict(items, item, f"{where}: {name}[{i}]") for i, item in enumerate(value)]
        values[name] = value
    return cls(**values)


def write_report(path: str | Path, report) -> None:
    """Write a report dataclass as JSON, atomically."""
    write_json_atomic(path, report_to_dict(report))


def read_report(path: str | Path, cls: type[R]) -> R:
    """Read report ``cls`` from ``path``; a missing, partial or foreign file is a one-line ReportError
    naming the path and how to redo the stage."""
    path = Path(path)
    redo = f"delete it or run `make rerun STAGE={cls.STAGE}`"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{path}: does not exist; run the {cls.STAGE} task") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ReportError(f"{path}: cannot read the {cls.STAGE} report ({error}); {redo}") from None
    except json.JSONDecodeError as error:
        raise ReportError(
            f"{path}: damaged {cls.STAGE} report (not valid JSON: {error.msg} at line {error.lineno}); {redo}"
        ) from None
    try:
        return report_from_dict(cls, data, str(path))
    except ReportError as error:
        raise ReportError(f"{error}; {redo}") from None
