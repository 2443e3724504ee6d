"""The Features engine for one split: samples -> shards of work in a process pool -> one length-ordered cache.

Work is split into shards of samples (``pipeline.features.shards``); each finished
shard is saved as its own part, so a run killed half-way resumes with the finished
shards. The parts live in a folder named by the stage fingerprint, so parts made with
other settings are never reused, and a part is reused only for the very same rows
(its key). The parts are merged into the cache at the end and then removed.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import multiprocessing
import os
import shutil
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from pipeline.config import AugmentConfig, Config
from pipeline.data.manifests import Reject, Sample, check_reject_fraction, write_rejects
from pipeline.features.audio_augment import noise_files, variants
from pipeline.features.cache import CacheWriter, cache_summary
from pipeline.features.shards import (
    DOWNMIXED,
    RESAMPLED,
    part_features,
    part_summary,
    process_shard,
    shard_key,
)
from pipeline.workdir import FeaturesFiles

log = logging.getLogger(__name__)

SHARD_SIZE = 32


class FeaturesError(RuntimeError):
    """The Features stage cannot finish (its working files changed under it)."""


# progress(done, total, rejected, audio_seconds)
ProgressFn = Callable[[int, int, int, float], None]


@dataclass
class FeaturesSummary:
    """What a Features run did for one split."""

    split: str
    cache: str
    rejects_report: str
    kept: int = 0
    rejected: int = 0
    audio_seconds: float = 0.0
    reasons: dict = field(default_factory=dict)
    resampled: int = 0  # kept utterances read from audio of another sample rate (features.resample)
    downmixed: int = 0  # kept utterances read from multi-channel audio (features.downmix)


def with_copies(samples: list[Sample], augment: AugmentConfig) -> tuple[list[Sample], list[tuple]]:
    """The training samples followed, each, by its augmented copies (``augment.speed_factors``,
    ``audio_copies``), and for every entry (the audio file to read, its Variant or None). A copy's path in
    the cache and its rejects source carry the copy's description."""
    if not augment.copies:
        return samples, [(s.audio_path, None) for s in samples]
    noises = noise_files(augment)
    expanded, sources = [], []
    for row, sample in enumerate(samples):
        expanded.append(sample)
        sources.append((sample.audio_path, None))
        for variant in variants(augment, row, noises):
            expanded.append(
                dataclasses.replace(
                    sample,
                    audio_path=f"{sample.audio_path}#{variant.copy}",
                    source=f"{sample.source} ({variant.describe()})",
                )
            )
            sources.append((sample.audio_path, variant))
    return expanded, sources


def _single_threaded_worker() -> None:
    # Each worker is one core's worth of work: BLAS threads per worker would only fight each other.
    threadpool_limits(1)


def _executor(workers: int) -> ProcessPoolExecutor:
    # fork is much faster to start, but unsafe once TensorFlow's threads exist in this process.
    method = "spawn" if "tensorflow" in sys.modules else "fork"
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context(method),
        initializer=_single_threaded_worker,
    )


def existing_summary(split: str, files: FeaturesFiles) -> FeaturesSummary:
    """The summary of a cache already written (by another pipeline sharing it): from the cache and its
    rejects report."""
    cache, report = files.cache, files.rejects
    summary = cache_summary(cache)
    reasons = (
        Counter(row["reason"] for row in csv.DictReader(open(report, newline="", encoding="utf-8")))
        if report.is_file()
        else {}
    )
    return FeaturesSummary(
        split=split,
        cache=str(cache),
        rejects_report=str(report),
        kept=summary["samples"],
        rejected=sum(reasons.values()),
        audio_seconds=summary["audio_seconds"],
        reasons=dict(reasons),
        resampled=summary["resampled_files"],
        downmixed=summary["downmixed_files"],
    )


def extract_split(
    files: FeaturesFiles,
    fingerprint: str,
    split: str,
    samples: list[Sample],
    rejects: list[Reject],
    config: Config,
    imported: tuple[Counter, tuple[Path, ...]],
    min_frames: Callable[[list[int]], int],
    progress: ProgressFn | None = None,
) -> FeaturesSummary:
    """Compute the features of ``samples`` (with their augmented copies for the train split) and write the
    cache ``files.cache`` (recording ``fingerprint``) and its rejects report.

    ``rejects`` are the manifest rows already refused; ``imported`` the rows the imports rejected for this
    split, by reason, and the files listing them (``check_reject_fraction``); ``min_frames(labels)`` the
    feature frames a transcript's labels need (the model family's output rate over CTC's need). Raises
    CorpusError when more than ``data.max_reject_fraction`` of the rows are rejected (the rejects report is
    written first)."""
    rows = len(samples) + len(rejects)  # manifest rows: what data.max_reject_fraction is a fraction of
    samples, audio_sources = with_copies(samples, config.augment if split == "train" else AugmentConfig())
    parts_dir = files.parts
    parts_dir.mkdir(parents=True, exist_ok=True)

    def job(position: int, sample: Sample) -> tuple:
        path, variant = audio_sources[position]
        return path, min_frames(sample.labels), variant, sample.offset, sample.duration

    shards = [samples[i : i + SHARD_SIZE] for i in range(0, len(samples), SHARD_SIZE)]
    jobs = [[job(i * SHARD_SIZE + k, s) for k, s in enumerate(shard)] for i, shard in enumerate(shards)]
    keys = [shard_key(shard_jobs) for shard_jobs in jobs]
    part_paths = [FeaturesFiles.part(parts_dir, index, key) for index, key in enumerate(keys)]
    _remove_other_parts(parts_dir, part_paths)
    _compute_parts(part_paths, jobs, keys, len(rejects), config, progress)

    is_copy = [variant is not None for _, variant in audio_sources]
    kept_samples, durations, conversions = _merge_parts(
        files, fingerprint, split, shards, part_paths, keys, rejects, is_copy, rows, config, imported
    )
    return FeaturesSummary(
        split=split,
        cache=str(files.cache),
        rejects_report=str(files.rejects),
        kept=len(kept_samples),
        rejected=len(rejects),
        audio_seconds=float(sum(durations)),
        reasons=dict(Counter(r.reason for r in rejects)),
        resampled=conversions["resampled_files"],
        downmixed=conversions["downmixed_files"],
    )


def _compute_parts(
    part_paths: list[Path],
    jobs: list[list[tuple]],
    keys: list[str],
    rejected_rows: int,
    config: Config,
    progress: ProgressFn | None,
) -> None:
    """Compute every shard whose part is not already finished, in ``features.workers`` processes; report
    progress (the ``rejected_rows`` already refused count as done and rejected)."""
    total = sum(len(shard_jobs) for shard_jobs in jobs) + rejected_rows
    done, rejected, seconds = rejected_rows, rejected_rows, 0.0

    todo = []
    for index, shard_jobs in enumerate(jobs):
        part = part_summary(part_paths[index], keys[index], len(shard_jobs))
        if part is None:
            todo.append(index)
        else:
            done += len(shard_jobs)
            rejected += int(np.sum(part["lengths"] < 0))
            seconds += float(np.sum(part["durations"][part["lengths"] >= 0]))
    if progress:
        progress(done, total, rejected, seconds)

    workers = config.features.workers or os.cpu_count() or 1
    max_duration = config.data.max_duration_s
    if workers == 1 or len(todo) <= 1:
        for index in todo:
            count, bad, secs = process_shard(
                str(part_paths[index]), jobs[index], config.features, max_duration, keys[index]
            )
            done, rejected, seconds = done + count, rejected + bad, seconds + secs
            if progress:
                progress(done, total, rejected, seconds)
    elif todo:
        with _executor(min(workers, len(todo))) as pool:
            futures = [
                pool.submit(
                    process_shard, str(part_paths[i]), jobs[i], config.features, max_duration, keys[i]
                )
                for i in todo
            ]
            for future in as_completed(futures):
                count, bad, secs = future.result()
                done, rejected, seconds = done + count, rejected + bad, seconds + secs
                if progress:
                    progress(done, total, rejected, seconds)


def _remove_other_parts(parts_dir: Path, wanted: list[Path]) -> None:
    """Remove the parts of ``parts_dir`` this run does not use: made from other rows (audio files that
    were missing then, a grown last shard), they would never be valid again."""
    keep = {path.name for path in wanted}
    stale = [path for path in parts_dir.glob("*.npz") if path.name not in keep]
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        log.info("%s: removed %d feature shards made from other rows", parts_dir, len(stale))


def _merge_parts(
    files: FeaturesFiles,
    fingerprint: str,
    split: str,
    shards: list,
    part_paths: list[Path],
    keys: list[str],
    rejects: list[Reject],
    is_copy: list[bool],
    rows: int,
    config: Config,
    imported: tuple[Counter, tuple[Path, ...]],
) -> tuple[list, list[float], dict[str, int]]:
    """Write the rejects report, check the reject fraction, then the cache from the finished parts:
    the kept utterances in length order, one shard's features in memory at a time. Returns the kept
    samples and their durations (manifest order), and how many kept rows (augmented copies not
    counted) were read resampled and downmixed (``resampled_files``, ``downmixed_files``, also
    recorded in the cache).

    The fraction counts manifest rows (``rows``; ``rejects`` starts with the rows the manifest check
    refused): a rejected augmented copy (``is_copy``, per entry) is listed in the report but counted
    neither as a row nor as a reject, so copies never dilute the limit. A split with no utterance left
    is an error, whatever the limit."""
    report = files.rejects
    row_rejects = list(rejects)
    # The index of every kept utterance (small: no features), then the cache in length order.
    kept: list[tuple[int, int, int]] = []  # (shard, position in shard, frames)
    kept_samples, durations = [], []
    conversions = {"resampled_files": 0, "downmixed_files": 0}
    for index, shard in enumerate(shards):
        part = part_summary(part_paths[index], keys[index], len(shard))
        if part is None:
            raise FeaturesError(
                f"{part_paths[index]}: a finished feature shard disappeared during the run; "
                f"run the Features task again"
            )
        for position, sample in enumerate(shard):
            length = int(part["lengths"][position])
            if length < 0:
                reject = Reject(
                    sample.source,
                    sample.audio_path,
                    str(part["reasons"][position]),
                    str(part["details"][position]),
                )
                rejects.append(reject)
                if not is_copy[index * SHARD_SIZE + position]:
                    row_rejects.append(reject)
                continue
            kept.append((index, position, length))
            if not is_copy[index * SHARD_SIZE + position]:
                how = int(part["converted"][position])
                conversions["resampled_files"] += bool(how & RESAMPLED)
                conversions["downmixed_files"] += bool(how & DOWNMIXED)
            kept_samples.append(sample)
            durations.append(float(part["durations"][position]))

    write_rejects(report, rejects)
    imported_reasons, import_rejects = imported
    check_reject_fraction(
        split,
        rows,
        row_rejects,
        config.data.max_reject_fraction,
        report,
        imported_reasons,
        import_rejects,
        kept=len(kept),
    )
    lengths = np.array([frames for _, _, frames in kept], np.int64)
    order = np.argsort(lengths, kind="stable")  # where each cache row comes from
    row_of = np.empty_like(order)
    row_of[order] = np.arange(len(order))  # where each kept utterance goes
    with CacheWriter(
        files.cache,
        fingerprint,
        config.features,
        lengths[order],
        [kept_samples[i].labels for i in order],
        [kept_samples[i].transcript for i in order],
        [kept_samples[i].audio_path for i in order],
        np.asarray(durations, np.float32)[order],
        counts=conversions,
    ) as writer:
        first = 0  # ``kept`` is in shard order: shard i's utterances are kept[first:stop]
        for index in range(len(shards)):  # one shard's features in memory at a time
            stop = first
            while stop < len(kept) and kept[stop][0] == index:
                stop += 1
            if stop == first:
                continue
            frames, start = part_features(part_paths[index]), 0
            for k in range(first, stop):
                writer.put(int(row_of[k]), frames[start : start + kept[k][2]])
                start += kept[k][2]
            first = stop
    shutil.rmtree(files.parts, ignore_errors=True)
    return kept_samples, durations, conversions
