"""The Features stage: a split's manifests -> checked samples -> its HDF5 feature cache and rejects report.

The engine (shards of work in a process pool, merged into the length-ordered cache)
is ``pipeline.features.extract``; this stage takes the cache's lock, reads the
manifests with the model's labels, and hands the engine the cache's files.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

from pipeline.dag import Stage, alphabet_of, cleans, is_instance, manifests_of, task_config
from pipeline.data.manifests import read_manifests
from pipeline.data.text import unreachable_labels
from pipeline.features.extract import (
    FeaturesError,
    FeaturesSummary,
    ProgressFn,
    existing_summary,
    extract_split,
)
from pipeline.files import remove_leftovers
from pipeline.fingerprints import FingerprintInputs
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from pipeline.model import model_family
from pipeline.model.labels import model_alphabet
from pipeline.model.objectives import model_objective
from pipeline.workdir import FEATURES_DIR, LEFTOVER_PATTERNS

log = logging.getLogger(__name__)


def _too_short_rule(inputs: FingerprintInputs, params: dict) -> dict:
    """The too-short check counts the family's output labels by the objective's rule: nothing is added
    for one label per frame and CTC's rule, so those caches keep their names."""
    config = inputs.config
    stride = model_family(config.model.architecture).stride(config.model)
    rule = model_objective(config.model.objective).data_rule
    return {
        **({"output_stride": stride} if stride != 1 else {}),
        **({"too_short_rule": rule} if rule != "ctc" else {}),
    }


STAGE = Stage(
    "features",
    "FeaturesSplit",
    params=("split", "task"),
    upstream=lambda config, params: [
        *manifests_of(config, params, params["split"]),
        *alphabet_of(config, params),
    ],
    group="Features",
    runs=lambda config, params: (
        is_instance(config, params)
        and (params["split"] == "train" or task_config(config, params).has_split(params["split"]))
    ),
    derived=_too_short_rule,
    directory=FEATURES_DIR,
    outputs=lambda layout, params: [
        layout.features_cache(params["split"]),
        layout.rejects_report(params["split"]),
        layout.features_parts(params["split"]),
    ],
)


def features_stage(layout: Layout, split: str, progress: ProgressFn | None = None) -> FeaturesSummary:
    """Check the corpus of ``split``, compute its features and write its cache and rejects report.

    Raises CorpusError when more than ``data.max_reject_fraction`` of the rows
    are rejected (the rejects report is written first). Two pipelines that
    share this cache (same features fingerprint) take turns: the second finds
    the cache written and returns its summary.
    """
    files = layout.features_files(split)
    cache = files.cache
    with stage_lock(cache):
        # This cache's temporaries (its own, its rejects report's, its parts') are written under this lock.
        remove_leftovers(cache.parent, LEFTOVER_PATTERNS, locked_prefixes=(f".{cache.stem}.",))
        remove_leftovers(files.parts, LEFTOVER_PATTERNS, locked_prefixes=(".",))
        if cache.is_file():
            return existing_summary(split, files)
        return _build(layout, split, progress)


def _build(layout: Layout, split: str, progress: ProgressFn | None) -> FeaturesSummary:
    config = layout.config
    alphabet = model_alphabet(layout.config, layout.alphabet)
    if split == "train" and alphabet.output == "characters" and not config.alphabet_auto:
        dead = unreachable_labels(alphabet.labels, config.data.text)
        if dead:
            log.warning(
                "%s: %s never occur in transcripts normalised with data.text (case %s, keep_punctuation %r): "
                "set data.text.case: keep or add them to data.text.keep_punctuation to train them",
                layout.alphabet,
                " ".join(repr(c) for c in dead),
                config.data.text.case,
                config.data.text.keep_punctuation,
            )
    files = layout.features_files(split)  # the fingerprint (and the manifests' digests it used), first
    digests: dict[str, str] = {}
    samples, rejects = read_manifests(
        layout.split_manifests(split), config.split_limit(split), alphabet, config.data.text, digests
    )
    changed = layout.changed_inputs(digests)
    if changed:
        raise FeaturesError(
            f"{changed[0]}: the manifest changed after this run was scheduled (the cache name "
            f"{files.cache.name} comes from its earlier content); run the Features task again"
        )
    family = model_family(config.model.architecture)  # its output rate: how many frames a label needs
    objective = model_objective(config.model.objective)  # how many output labels a transcript needs
    return extract_split(
        files,
        layout.features_fingerprint(split),
        split,
        samples,
        rejects,
        config,
        _import_rejects(layout, split),
        lambda labels: family.min_feature_frames(config.model, objective.min_outputs(labels)),
        progress,
    )


def _import_rejects(layout: Layout, split: str) -> tuple[Counter, tuple[Path, ...]]:
    """The rows the imports of ``data.corpora`` rejected for ``split``, by reason (none when
    ``data.limit_<split>`` takes only the first rows), and the rejects files that list them."""
    if layout.config.split_limit(split):
        return Counter(), ()
    found, files = Counter(), []
    if cleans(layout.config, split):  # the malformed rows Clean left out (its suspects are no defect)
        cleaned = json.loads(layout.clean_files.report.read_text(encoding="utf-8"))["rejected_by_split"][
            split
        ]
        if cleaned:
            found.update(cleaned)
            files.append(layout.clean_files.rejects)
    for key in layout.corpora:
        imported = layout.corpus_files(key)
        rejected = json.loads(imported.report.read_text(encoding="utf-8"))["rejected_by_split"][split]
        if rejected:
            found.update(rejected)
            files.append(imported.rejects)
    return found, tuple(files)
