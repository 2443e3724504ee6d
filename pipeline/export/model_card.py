"""The export's model card: ``MODEL_CARD.md`` and the ``card`` entry of ``metadata.json``.

The fields are Coqui STT's model metadata (their export's ``--export_author_id``,
``--export_model_name``, ``--export_model_version``, ``--export_contact_info``,
``--export_license``, ``--export_language``, ``--export_description``, written as
the YAML front matter of a Markdown file), taken from ``export.card``; the pipeline
adds what it knows: the training data's samples and hours (Train's report), the
best-dev figures, and with ``export.card.evaluation`` the Evaluate figures and
the decoder they were decoded with. An export of averaged weights (``export.average``) says so: which
checkpoints were averaged, that the best-dev figures are of the single best checkpoint, not of the
exported model, and with ``export.card.evaluation`` the average's own dev figures from Evaluate.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pipeline.config import Config, is_deepspeech
from pipeline.model.deepspeech import FAMILY as DEEPSPEECH
from pipeline.reports import EvaluationReport, ExportRecord, TrainReport, read_report
from pipeline.workdir import EXPORT_FILES

# Coqui's front matter keys, in their order, and the card entry each comes from.
FRONT_MATTER = (
    ("author", "author"),
    ("model_name", "name"),
    ("model_version", "version"),
    ("contact_info", "contact"),
    ("license", "license"),
    ("language", "language"),
    ("runtime", "runtime"),
)


def card_language(config: Config) -> str:
    """The model's BCP 47 tag: ``export.card.language``, else ``data.text.language``, else ``und``."""
    return config.export.card.language or config.data.text.language or "und"


def _train_report(path: Path) -> TrainReport | None:
    return read_report(path, TrainReport) if path.is_file() else None


def _train_data(train: TrainReport | None, task: str) -> tuple[int | None, float | None]:
    """(train samples, hours) of the data the card lists: for a task of a multi-task run, the task's own
    (the run's report sums every task's)."""
    if train is None:
        return None, None
    for entry in train.tasks or ():
        if task and entry["name"] == task:
            return entry["train_samples"], round(entry["train_audio_hours"], 3)
    return train.train_samples, round(train.train_audio_hours, 3)


def _evaluation(config: Config, path: Path, checkpoint: str) -> dict | None:
    """Evaluate's figures of ``checkpoint`` from its report at ``path`` (``export.card.evaluation``), else
    None. A ReportError when the report is missing; a ValueError when it evaluated another checkpoint."""
    if not config.export.card.evaluation:
        return None
    report = read_report(path, EvaluationReport)
    if report.checkpoint != checkpoint:
        raise ValueError(
            f"{path}: evaluates {report.checkpoint}, the export is of {checkpoint}; export.card.evaluation "
            f"takes the figures of the exported checkpoint only (run Evaluate for it, or set it to false)"
        )
    figures = {
        "test_samples": report.samples_count,
        "headline": report.headline,
        "loss": report.loss,
        "greedy": {"wer": report.wer, "cer": report.cer},
        "decoder": None,
        "with_decoder": None,
    }
    if report.wer_lm is not None:
        figures["decoder"] = dict(report.decoder_lm or {})
        figures["with_decoder"] = {"wer": report.wer_lm, "cer": report.cer_lm}
    if report.average is not None and report.average.get("dev"):
        figures["dev_average"] = report.average["dev"]  # the exported (averaged) model's own dev figures
    return figures


def build_card(
    config: Config,
    record: ExportRecord,
    train_report: Path,
    evaluation_report: Path,
    average: dict | None = None,
) -> dict:
    """The card of the export ``record`` describes (its checkpoint, version, files and decoder), from the
    config's ``export.card`` and the Train report at ``train_report`` (and with
    ``export.card.evaluation``, the Evaluate report at ``evaluation_report``). ``average``: the checkpoints
    the exported weights are the mean of (``Averaging.to_dict``), None for a single checkpoint."""
    card = config.export.card
    train = _train_report(train_report)
    data = config.data
    # a task's export: the task's own figures in the best validation (the run's are the tasks' mean)
    best = record.best_dev and record.best_dev.of_task(config.task)
    samples, hours = _train_data(train, config.task)
    deepspeech = is_deepspeech(config.model.architecture)
    return {
        "name": card.name or "-".join(filter(None, (Path(config.source).stem, config.task))),
        "version": card.version or str(record.model_version),
        "language": card_language(config),
        "license": card.license,
        "author": card.author,
        "contact": card.contact,
        "description": card.description,
        "runtime": "tflite",
        "training_data": {
            "description": card.training_data,
            "corpora": [corpus.key for corpus in data.corpora],
            "manifests": [Path(name).name for name in data.train_files],
            "samples": samples,
            "hours": hours,
        },
        "model": {
            "architecture": record.architecture,
            # DeepSpeech's width, as DeepSpeech's cards give it; another family's own settings instead
            "n_hidden": DEEPSPEECH.settings(config.model).n_hidden if deepspeech else None,
            "settings": None if deepspeech else _family_settings(config),
            "features": record.features.get("type", "mfcc"),
            "sample_rate": record.features.get("sample_rate"),
            "output": record.output,
            "n_classes": record.n_classes,
            "quantized": record.tflite_quantized,
            # a transducer's predictor and joiner (the export metadata's entry); None for CTC
            "transducer": record.transducer,
        },
        "training": {
            "global_step": record.global_step,
            "best_dev": None
            if best is None
            else {"epoch": best.epoch, "dev_loss": best.dev_loss, "wer": best.wer, "cer": best.cer},
            "average": None
            if average is None
            else {key: average[key] for key in ("mode", "asked", "epochs", "missing")},
        },
        "evaluation": _evaluation(config, evaluation_report, record.checkpoint),
        "decoder": record.decoder,
        "fingerprint": record.fingerprint,
    }


def _family_settings(config: Config) -> dict | None:
    """The model family's own settings (``model.<family>:``), None for a family without them."""
    options = config.model.options
    return dataclasses.asdict(options) if dataclasses.is_dataclass(options) else None


def _figures(rates: dict, headline: str) -> str:
    order = ("cer", "wer") if headline == "cer" else ("wer", "cer")
    return ", ".join(f"{name.upper()} {rates[name]:.4f}" for name in order)


def _settings(settings: dict) -> str:
    shown = {k: v for k, v in settings.items() if k != "type" and not isinstance(v, (dict, list))}
    return ", ".join(f"{k} {v}" for k, v in shown.items())


def _geometry(model: dict) -> str:
    """DeepSpeech's width, or another family's settings (cards written before these had n_hidden only)."""
    if model.get("settings"):
        return _settings(model["settings"])
    return f"n_hidden {model['n_hidden']}"


def render_card(card: dict, files: dict) -> str:
    """``MODEL_CARD.md``: Coqui's fields as YAML front matter (JSON strings, which YAML reads as they are),
    then the card in prose. ``files``: the export's ``{kind: name}``."""
    lines = ["---"]
    lines += [f"{key}: {json.dumps(str(card[entry]), ensure_ascii=False)}" for key, entry in FRONT_MATTER]
    lines += ["---", "", f"# {card['name']} {card['version']}", ""]
    lines += [card["description"] or "No description was given (`export.card.description`).", ""]
    lines += [
        f"- Language: {card['language']}",
        f"- Licence: {card['license'] or 'not stated (`export.card.license`)'}",
        f"- Author: {card['author'] or 'not stated (`export.card.author`)'}"
        + (f" ({card['contact']})" if card["contact"] else ""),
        "",
        "## Model",
        "",
    ]
    model = card["model"]
    lines += [
        f"- Architecture: {model['architecture']} ({_geometry(model)}), "
        f"{model['features']} features at {model['sample_rate']} Hz, "
        f"{model['n_classes']} output classes ({model['output']})",
        *_transducer_lines(model.get("transducer")),
        f"- TFLite weights: {'int8 (dynamic range)' if model['quantized'] else 'float32'}",
        *_average_lines(card["training"].get("average")),
        f"- Files: {', '.join(sorted(files.values()))}",
        f"- Export fingerprint: {card['fingerprint']}",
        "",
        "## Training data",
        "",
    ]
    data = card["training_data"]
    if data["description"]:
        lines += [data["description"], ""]
    sources = data["corpora"] + data["manifests"]
    if data["hours"] is None:
        lines.append(
            "- Amount: not known (no Train report: the export was made from a checkpoint given by hand)"
        )
    else:
        lines.append(f"- {data['hours']:.2f} hours in {data['samples']} utterances (Train's report)")
    lines += [f"- From: {', '.join(sources) if sources else 'not stated'}", "", "## Figures", ""]
    training = card["training"]
    best = training["best_dev"]
    evaluation = card["evaluation"]
    if best and training.get("average"):
        lines.append(
            f"- Best dev of a single checkpoint (epoch {best['epoch']}, greedy decoding), not of this "
            f"averaged model: {_figures(best, 'wer')}, loss {best['dev_loss']:.4f}"
        )
    elif best:
        lines.append(
            f"- Best dev (epoch {best['epoch']}, step {training['global_step']}, greedy decoding): "
            f"{_figures(best, 'wer')}, loss {best['dev_loss']:.4f}"
        )
    if evaluation is not None and evaluation.get("dev_average"):
        dev = evaluation["dev_average"]
        lines.append(
            f"- Dev, this averaged model, greedy: {_figures(dev, dev.get('headline', 'wer'))}, "
            f"loss {dev['loss']:.4f}"
        )
    if evaluation is None:
        lines.append("- Test: not in this card (`export.card.evaluation: false`)")
    else:
        headline = evaluation["headline"]
        lines.append(
            f"- Test ({evaluation['test_samples']} utterances), greedy: "
            f"{_figures(evaluation['greedy'], headline)}"
        )
        if evaluation["with_decoder"]:
            decoder = evaluation["decoder"]
            lines.append(
                f"- Test, {decoder.get('type', 'beam')} decoder ({_settings(decoder)}): "
                f"{_figures(evaluation['with_decoder'], headline)}"
            )
    if card["decoder"]:
        lines.append(f"- The export's decoder: {card['decoder'].get('type')} ({_settings(card['decoder'])})")
    return "\n".join(lines) + "\n"


def _transducer_lines(transducer: dict | None) -> list[str]:
    """A transducer's objective and search, or nothing for a CTC model."""
    if not transducer:
        return []
    return [
        f"- Objective: transducer (RNN-T): a stateless predictor over the last {transducer['context_size']} "
        f"labels and a joiner {transducer['joint_dim']} wide",
        f"- Decoding: modified beam search (beam {transducer['beam']}) or greedy search (at most "
        f"{transducer['max_symbols']} labels a frame) over the export's predictor and joiner; no language "
        f"model",
    ]


def _average_lines(average: dict | None) -> list[str]:
    """The card's line saying the weights are a mean of checkpoints (none for a single checkpoint)."""
    if not average:
        return []
    epochs = ", ".join(map(str, average["epochs"]))
    line = (
        f"- Weights: the mean of {len(average['epochs'])} epoch-end checkpoints "
        f"(export.average {average['mode']} {average['asked']}: epochs {epochs})"
    )
    if average["missing"]:
        line += f"; epochs {', '.join(map(str, average['missing']))} wanted but not kept, so left out"
    return [line]


def write_model_card(
    config: Config,
    record: ExportRecord,
    root: Path,
    *,
    train_report: Path,
    evaluation_report: Path,
    average: dict | None = None,
) -> dict:
    """Build the card of ``record`` (``build_card``; ``average``: the checkpoints averaged, None for one),
    write it as ``MODEL_CARD.md`` into the export being assembled in ``root``, and return it (for
    ``metadata.json``'s ``card``)."""
    card = build_card(config, record, train_report, evaluation_report, average)
    (root / EXPORT_FILES["model_card"]).write_text(render_card(card, record.files), encoding="utf-8")
    return card
