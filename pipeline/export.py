"""Export: the best-dev checkpoint as SavedModel, frozen GraphDef and TFLite, with metadata.

The export is assembled in a hidden staging directory beside its destination, with
a manifest of every file's SHA-256 and size, and exchanged with the old export in
one step only when complete: a crash never leaves a half export that a client or a
rerun would trust, and the export path is never missing.
"""
from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from pathlib import Path
from typing import Callable, Optional

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from native_client.alphabet import Alphabet, load_alphabet
from native_client.arpa import is_arpa
from native_client.metadata import FORMAT, FORMAT_VERSION, write_manifest
from pipeline.checkpoints import load_trained_model, resolve_checkpoint
from pipeline.decoding import beam_settings, lm_built, read_lm_report, verify_lm_files
from pipeline.features import feature_settings
from pipeline.inference_graph import SIGNATURE, TENSORS, InferenceGraph
from pipeline.files import remove_leftovers, replace_directory
from pipeline.layout import EXPORT_FILES, LEFTOVER_PATTERNS, WORD_ARPA, WORD_BINARY, ExportFiles, Layout
from pipeline.reports import ExportRecord, TrainReport, read_report, write_report

log = logging.getLogger(__name__)


def build_metadata(layout: Layout, alphabet: Alphabet, checkpoint: str, model_version: int,
                   n_input: int) -> ExportRecord:
    """The metadata a client needs: features, geometry, alphabet, versions, fingerprints, and the
    best-dev figures and step of the Train run it comes from (None when an explicitly given checkpoint
    has no Train report, e.g. an untrained model in a benchmark)."""
    config = layout.config
    report = layout.train_run.report
    train = read_report(report, TrainReport) if report.is_file() else None
    return ExportRecord(
        format=FORMAT, format_version=FORMAT_VERSION, model_version=model_version,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        fingerprint=layout.export_fingerprint, train_fingerprint=layout.train_fingerprint,
        checkpoint=checkpoint, config=config.source, global_step=train and train.global_step, best_dev=train and train.best_dev,
        features=feature_settings(config.features).to_dict(),
        n_context=config.model.n_context, n_input=n_input, n_steps=config.export.n_steps,
        n_hidden=config.model.n_hidden, n_classes=alphabet.n_classes,
        alphabet=list(alphabet.labels), files=dict(EXPORT_FILES), tensors=dict(TENSORS),
        tflite_quantized=config.export.quantize)


def write_frozen_graph(graph: InferenceGraph, path: Path) -> dict:
    """Freeze the streaming step (variables folded into constants) to ``path``; returns its tensor names."""
    concrete = graph.stream.get_concrete_function()
    frozen = convert_variables_to_constants_v2(concrete)
    path.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    inputs = dict(zip(("input", "state_h", "state_c"), (t.name for t in frozen.inputs)))
    # Outputs come flattened in the sorted-key order of the function's returned dict.
    by_name = dict(zip(sorted(concrete.structured_outputs), (t.name for t in frozen.outputs)))
    outputs = {key: by_name[TENSORS[key]] for key in ("logits", "new_state_h", "new_state_c")}
    return {"inputs": inputs, "outputs": outputs}


def write_tflite(saved_model: Path, path: Path, quantize: bool) -> None:
    """Convert the SavedModel's streaming signature to TFLite, dynamic-range int8 when ``quantize``."""
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model), signature_keys=[SIGNATURE])
    if quantize:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    path.write_bytes(converter.convert())


def copy_language_model(layout: Layout, staging: ExportFiles) -> dict:
    """Copy the LanguageModel stage's LM files into the export; returns the metadata ``decoder`` entry."""
    verify_lm_files(layout, deep=True)
    report = read_lm_report(layout)
    lm = layout.lm
    entry = {**dataclasses.asdict(beam_settings(layout)), "tuned": layout.config.decoder.tune}
    word_lm = lm.resolve(report.lm)
    entry["lm"] = WORD_ARPA if is_arpa(word_lm) else WORD_BINARY
    shutil.copyfile(word_lm, staging.root / entry["lm"])
    shutil.copyfile(lm.vocabulary, staging.root / lm.vocabulary.name)
    entry["vocabulary"] = lm.vocabulary.name
    if report.char_lm:
        entry["char_lm"] = lm.char_arpa.name
        shutil.copyfile(lm.resolve(report.char_lm), staging.root / entry["char_lm"])
    return entry


def export_stage(layout: Layout, checkpoint: Optional[str | Path] = None,
                 on_status: Callable[[str, float], None] = lambda message, percent: None,
                 with_lm: Optional[bool] = None) -> ExportFiles:
    """Export the best-dev checkpoint (or ``checkpoint``) to ``paths.export_dir``; returns the export.

    With ``export.versioned`` each export goes to a new numbered directory below it. The
    LanguageModel stage's LM and vocabulary are copied in (``with_lm=None``: when it has run).
    """
    config = layout.config
    version = max(layout.export_versions(), default=0) + 1 if config.export.versioned else None
    destination = layout.export_destination(version)
    staging = ExportFiles(destination.staging())
    remove_leftovers(destination.root.parent, LEFTOVER_PATTERNS)
    shutil.rmtree(staging.root, ignore_errors=True)
    staging.root.mkdir(parents=True)
    try:
        on_status("loading the best-dev checkpoint", 0)
        alphabet = load_alphabet(layout.alphabet)
        prefix = resolve_checkpoint(checkpoint or layout.train_run.best)
        model = load_trained_model(config, prefix, config.features.numcep, alphabet.n_classes)
        metadata = build_metadata(layout, alphabet, prefix, version or 1, config.features.numcep)
        graph = InferenceGraph(model, config.export.n_steps, dataclasses.asdict(metadata))
        on_status("writing the SavedModel", 10)
        tf.saved_model.save(graph, str(staging.file("saved_model")),
                            signatures={SIGNATURE: graph.stream, "utterance": graph.utterance, "metadata": graph.metadata})
        on_status("freezing the graph", 40)
        frozen = write_frozen_graph(graph, staging.file("frozen_graph"))
        on_status("converting to TFLite" + (" (int8 dynamic range)" if config.export.quantize else ""), 55)
        write_tflite(staging.file("saved_model"), staging.file("tflite"), config.export.quantize)
        staging.file("alphabet").write_text(alphabet.to_text(), encoding="utf-8")
        decoder = None
        if with_lm or (with_lm is None and lm_built(layout)):
            on_status("copying the language model", 90)
            decoder = copy_language_model(layout, staging)
        on_status("writing metadata", 95)
        metadata = dataclasses.replace(metadata, frozen_graph=frozen, decoder=decoder)
        write_report(staging.metadata, metadata)
        write_manifest(staging.root)
        replace_directory(staging.root, destination.root)
    except BaseException:
        shutil.rmtree(staging.root, ignore_errors=True)
        raise
    on_status(f"exported to {destination.root}", 100)
    log.info("Exported %s (step %s) to %s", prefix, metadata.global_step, destination.root)
    return destination
