"""The files of an export: metadata, frozen graph, TFLite flatbuffer, and the language model copied in."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from native_client.alphabet import Labels
from native_client.arpa import is_arpa
from native_client.metadata import FORMAT, FORMAT_VERSION, FORMAT_VERSION_WITHOUT_TRANSDUCER
from pipeline.config import Config
from pipeline.export.inference_graph import (
    BATCH_SIGNATURE,
    JOIN,
    PREDICT,
    SIGNATURE,
    UTTERANCE,
    InferenceGraph,
)
from pipeline.features.frontend import client_features
from pipeline.lm.files import read_lm_report, verify_lm_files
from pipeline.model import model_family
from pipeline.model.family import WINDOWS
from pipeline.reports import ExportRecord, TrainReport, read_report
from pipeline.workdir import EXPORT_FILES, WORD_ARPA, WORD_BINARY, ExportFiles, LMFiles


def build_metadata(
    config: Config,
    alphabet: Labels,
    checkpoint: str,
    model_version: int,
    n_input: int,
    tensors: dict,
    *,
    train_report: Path,
    fingerprint: str,
    train_fingerprint: str,
    transducer: dict | None = None,
) -> ExportRecord:
    """The metadata a client needs: features, geometry, the output labels (an alphabet, or ``output:
    bytes``), the text settings the client applies (``data.text``), versions, fingerprints, and the
    best-dev figures and step of the Train run it comes from (None when an explicitly given checkpoint
    has no Train report, e.g. an untrained model in a benchmark); the family's output stride and streaming
    input (``streaming``: None without a streaming form); the task, for a task of a multi-task config.
    ``tensors``: the inference graph's tensor names (``InferenceGraph.tensors``). ``fingerprint``,
    ``train_fingerprint``: the Export's and the Train run's; ``train_report``: that run's report. The
    ``features`` are what the client computes (``client_features``); ``normalization: global`` says the
    graph normalises them with the training set's statistics, which are weights of the model.
    ``transducer``: a transducer's entry (``transducer_entry``), which makes the export format 7; a CTC
    model's stays format 6, which older clients read."""
    train = read_report(train_report, TrainReport) if train_report.is_file() else None
    family = model_family(config.model.architecture)
    streaming = None  # what one streaming call takes; None: the export runs whole utterances only
    if tensors["signature"] != UTTERANCE:
        streaming = family.stream_input(config.model, config.export.n_steps).to_dict()
    return ExportRecord(
        format=FORMAT,
        format_version=FORMAT_VERSION if transducer else FORMAT_VERSION_WITHOUT_TRANSDUCER,
        model_version=model_version,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        fingerprint=fingerprint,
        train_fingerprint=train_fingerprint,
        checkpoint=checkpoint,
        config=config.source,
        global_step=train and train.global_step,
        best_dev=train and train.best_dev,
        architecture=config.model.architecture,
        features=client_features(config.features).to_dict(),
        normalization="global" if config.features.normalize == "global" else None,
        n_context=streaming["context"] if streaming and streaming["input"] == WINDOWS else 0,
        stride=family.stride(config.model),
        streaming=streaming,
        n_input=n_input,
        n_steps=streaming["chunk"] if streaming else config.export.n_steps,
        n_classes=alphabet.n_classes,
        alphabet=list(alphabet.labels) if alphabet.output == "characters" else [],
        files={
            kind: name
            for kind, name in EXPORT_FILES.items()
            if (kind != "coqui_tflite" or config.export.coqui_tflite)
            and (kind != "onnx" or config.export.onnx)
            and (kind != "alphabet" or alphabet.output == "characters")
        },
        tensors=tensors,
        tflite_quantized=config.export.quantize,
        output=alphabet.output,
        text=config.data.text.to_dict(),
        task=config.task or None,
        transducer=transducer,
    )


def write_frozen_graph(graph: InferenceGraph, path: Path) -> dict:
    """Freeze the streaming step (the whole utterance for a family without one; variables folded into
    constants) to ``path``; returns its graph tensor names: ``inputs`` (the step's input, then the state)
    and ``outputs`` (the logits, then the new state)."""
    concrete = graph.main.get_concrete_function()
    frozen = convert_variables_to_constants_v2(concrete)
    path.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    # Outputs come flattened in the sorted-key order of the function's returned dict.
    by_name = dict(zip(sorted(concrete.structured_outputs), (t.name for t in frozen.outputs), strict=True))
    tensors = graph.tensors()
    return {
        "inputs": [t.name for t in frozen.inputs],
        "outputs": [by_name[tensors["logits"]], *(by_name[s["output"]] for s in tensors["state"])],
    }


def write_tflite(
    saved_model: Path,
    path: Path,
    quantize: bool,
    batched: bool = False,
    signature: str = SIGNATURE,
    transducer: bool = False,
) -> None:
    """Convert the SavedModel's streaming signature (``signature``: ``utterance`` for a family without a
    streaming form) to TFLite, dynamic-range int8 when ``quantize``; ``batched``: its batched streaming
    signature too (one flatbuffer, the weights shared: about 5% more bytes for the small model, see
    docs/CLIENT.md "Serving"); ``transducer``: the predictor's and the joiner's signatures too."""
    keys = [signature, BATCH_SIGNATURE] if batched else [signature]
    if transducer:
        keys += [PREDICT, JOIN]
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model), signature_keys=keys)
    if quantize:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    path.write_bytes(converter.convert())


def copy_language_model(config: Config, lm: LMFiles, settings: dict, staging: ExportFiles) -> dict:
    """Copy the LanguageModel stage's LM files in ``lm`` into the export; returns the metadata ``decoder``
    entry: the decoder's type, its ``settings`` (``decoder_settings``: tuned ones when tuning is on) and
    the LM files' names."""
    verify_lm_files(lm, deep=True)
    report = read_lm_report(lm)
    entry = {
        "type": config.decoder.type,
        **settings,
        "tuned": config.decoder.tune,
    }
    word_lm = lm.resolve(report.lm)
    entry["lm"] = WORD_ARPA if is_arpa(word_lm) else WORD_BINARY
    shutil.copyfile(word_lm, staging.root / entry["lm"])
    shutil.copyfile(lm.vocabulary, staging.root / lm.vocabulary.name)
    entry["vocabulary"] = lm.vocabulary.name
    if report.char_lm:
        entry["char_lm"] = lm.char_arpa.name
        shutil.copyfile(lm.resolve(report.char_lm), staging.root / entry["char_lm"])
    return entry
