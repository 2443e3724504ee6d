"""Export: the best-dev checkpoint as SavedModel, frozen GraphDef and TFLite, with metadata.

The export is assembled in a hidden staging directory beside its destination and
moved into place only when complete, so a crash never leaves a half export that a
client or a rerun would trust.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Optional

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from native_client.arpa import is_arpa
from native_client.metadata import FORMAT, FORMAT_VERSION, METADATA_NAME
from pipeline import layout
from pipeline.alphabet import load_alphabet
from pipeline.checkpoints import resolve_checkpoint
from pipeline.config import Config
from pipeline.decoding import beam_settings, read_lm_report
from pipeline.features import feature_settings
from pipeline.files import write_json_atomic
from pipeline.lm import CHAR_LM, VOCAB, lm_file
from pipeline.inference_graph import SIGNATURE, TENSORS, InferenceGraph
from pipeline.training_run import load_trained_model, read_train_report

log = logging.getLogger(__name__)

FILES = {"saved_model": "saved_model", "frozen_graph": "output_graph.pb", "tflite": "model.tflite",
         "alphabet": "alphabet.txt"}


def build_metadata(config: Config, checkpoint: str, model_version: int, n_input: int, n_classes: int) -> dict:
    """The metadata a client needs: features, geometry, alphabet, versions and fingerprints."""
    alphabet = load_alphabet(layout.alphabet_path(config))
    report = read_train_report(layout.train_dir(config)) or {}
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "model_version": model_version,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "fingerprint": layout.export_fingerprint(config), "train_fingerprint": layout.train_fingerprint(config),
        "checkpoint": checkpoint, "config": config.source,
        "global_step": report.get("global_step"), "best_dev": report.get("best"),
        "features": feature_settings(config.features).to_dict(),
        "n_context": config.model.n_context, "n_input": n_input, "n_steps": config.export.n_steps,
        "n_hidden": config.model.n_hidden, "n_classes": n_classes,
        "alphabet": list(alphabet.labels), "files": dict(FILES), "tensors": dict(TENSORS),
        "tflite_quantized": config.export.quantize,
    }


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


def next_version(root: Path) -> int:
    """One more than the highest numbered version under ``root`` (1 for none)."""
    numbers = [int(p.name) for p in root.iterdir() if re.fullmatch(r"\d+", p.name)] if root.is_dir() else []
    return max(numbers, default=0) + 1


def publish(staging: Path, destination: Path) -> None:
    """Move the finished ``staging`` directory to ``destination``, replacing what was there."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    if destination.exists():
        old = destination.with_name(f".{destination.name}.old-{os.getpid()}")
        os.replace(destination, old)
        os.replace(staging, destination)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, destination)


def copy_language_model(config: Config, staging: Path) -> dict:
    """Copy the LanguageModel stage's LM files into the export; returns the metadata ``decoder`` entry."""
    report = read_lm_report(config)
    directory = layout.lm_dir(config)
    entry = {**dataclasses.asdict(beam_settings(config)), "tuned": config.decoder.tune}
    word_lm = lm_file(directory, report, "lm")
    entry["lm"] = "lm.arpa" if is_arpa(word_lm) else "lm.binary"
    shutil.copyfile(word_lm, staging / entry["lm"])
    shutil.copyfile(directory / VOCAB, staging / VOCAB)
    entry["vocabulary"] = VOCAB
    if report.get("char_lm"):
        entry["char_lm"] = CHAR_LM
        shutil.copyfile(lm_file(directory, report, "char_lm"), staging / CHAR_LM)
    return entry


def export_stage(config: Config, checkpoint: Optional[str | Path] = None,
                 on_status: Callable[[str, float], None] = lambda message, percent: None,
                 with_lm: Optional[bool] = None) -> Path:
    """Export the best-dev checkpoint (or ``checkpoint``) to ``paths.export_dir``; returns the export directory.

    With ``export.versioned`` each export goes to a new numbered directory below it. The
    LanguageModel stage's LM and vocabulary are copied in (``with_lm=None``: when it has run).
    """
    root = layout.export_dir(config)
    versioned = config.export.versioned
    version = next_version(root) if versioned else 1
    destination = root / str(version) if versioned else root
    staging = destination.with_name(f".{destination.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        on_status("loading the best-dev checkpoint", 0)
        alphabet = load_alphabet(layout.alphabet_path(config))
        prefix = resolve_checkpoint(checkpoint or layout.train_dir(config) / "best")
        model = load_trained_model(config, prefix, config.features.numcep, alphabet.n_classes)
        metadata = build_metadata(config, prefix, version, config.features.numcep, alphabet.n_classes)
        graph = InferenceGraph(model, config.export.n_steps, metadata)
        on_status("writing the SavedModel", 10)
        tf.saved_model.save(graph, str(staging / FILES["saved_model"]),
                            signatures={SIGNATURE: graph.stream, "utterance": graph.utterance, "metadata": graph.metadata})
        on_status("freezing the graph", 40)
        metadata["frozen_graph"] = write_frozen_graph(graph, staging / FILES["frozen_graph"])
        on_status("converting to TFLite" + (" (int8 dynamic range)" if config.export.quantize else ""), 55)
        write_tflite(staging / FILES["saved_model"], staging / FILES["tflite"], config.export.quantize)
        (staging / FILES["alphabet"]).write_text(alphabet.to_text(), encoding="utf-8")
        if with_lm or (with_lm is None and read_lm_report(config) is not None):
            on_status("copying the language model", 90)
            metadata["decoder"] = copy_language_model(config, staging)
        on_status("writing metadata", 95)
        write_json_atomic(staging / METADATA_NAME, metadata)
        publish(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("Exported %s (step %s) to %s", prefix, metadata.get("global_step"), destination)
    return destination

