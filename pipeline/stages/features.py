"""The Features stage: manifests -> checked samples -> MFCC in parallel shards -> one HDF5 cache per split.

Work is split into shards of samples; each finished shard is saved as its
own ``.npz`` part (written under a temporary name, then renamed), so a run
killed half-way resumes with the finished shards. The parts live in a folder
named by the stage fingerprint, so parts made with other settings are never
reused, and each part's name carries a digest of exactly the rows it was
computed from (audio path, size and modification time, segment, copy): which
rows a shard holds depends on which audio files exist, so a part is reused
only for the very same rows. The parts are merged into the cache at the end
and then removed.

A long file's features are computed block by block (the front ends stream
frame-exactly), so memory does not grow with one file's length beyond its
frames.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
import zipfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from native_client.audio import AudioError, open_checked
from pipeline.config import AugmentConfig, FeaturesConfig
from pipeline.data.manifests import Reject, Sample, check_reject_fraction, read_manifests, write_rejects
from pipeline.data.text import unreachable_labels
from pipeline.features.audio_augment import apply_variant, noise_files, variants
from pipeline.features.cache import CacheWriter, cache_summary
from pipeline.features.frontend import ctc_min_frames, feature_pipeline
from pipeline.files import atomic_path, remove_leftovers
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from pipeline.model import model_family
from pipeline.model.labels import model_alphabet
from pipeline.workdir import LEFTOVER_PATTERNS

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


# Bits of a shard's ``converted`` array: how an utterance's audio was read.
RESAMPLED, DOWNMIXED = 1, 2


# Seconds of audio read (and featurised) at once: a long file is never in memory whole.
AUDIO_BLOCK_S = 20.0


def _utterance(
    job: tuple, features: FeaturesConfig, computation, max_duration_s: float
) -> tuple[np.ndarray, float, int]:
    """The features ``[frames, feature_size]``, duration (seconds) and how the audio was converted
    (``RESAMPLED | DOWNMIXED`` bits) of one job; AudioError when unusable.

    Audio longer than ``max_duration_s`` (when not 0) is refused as ``too_long`` from its header, before
    anything is decoded. Without an augmented copy the audio is read and featurised in blocks."""
    audio_path, _, *extra = job
    variant = extra[0] if extra else None
    offset, length = extra[1:3] if len(extra) >= 3 else (0.0, None)
    audio = open_checked(
        audio_path,
        features.sample_rate,
        offset=offset,
        duration=length,
        convert_rate=features.resample,
        downmix=features.downmix,
        convert_hint="set features.resample: true to convert",
        downmix_hint="set features.downmix: true to average them",
    )

    def too_long(duration: float) -> AudioError:
        return AudioError(
            "too_long",
            f"{audio_path}: {duration:.2f} s of audio, more than data.max_duration_s {max_duration_s:g} s",
        )

    speed = variant.speed if variant is not None else 1.0
    if max_duration_s and audio.seconds / speed > max_duration_s + 0.5:  # the header's length, give or take
        raise too_long(audio.seconds / speed)
    if variant is not None:
        whole = np.concatenate(list(audio.blocks(AUDIO_BLOCK_S)))
        samples = apply_variant(whole, variant, features.sample_rate)
        count = len(samples)
        if max_duration_s and count / features.sample_rate > max_duration_s:
            raise too_long(count / features.sample_rate)
        frames = computation.frames(samples)
    else:
        frames, count = computation.frames_of_blocks(audio.blocks(AUDIO_BLOCK_S))
    duration = count / features.sample_rate
    if max_duration_s and duration > max_duration_s:
        raise too_long(duration)
    return frames, duration, RESAMPLED * audio.resampled | DOWNMIXED * (audio.info.channels > 1)


def _process_shard(
    part: str, jobs: list[tuple], features: FeaturesConfig, max_duration_s: float, key: str = ""
) -> tuple[int, int, float]:
    """Compute one shard and save it as ``part`` (atomically); returns (count, rejected, audio seconds).

    A job is (audio path, minimum frames[, Variant[, offset, duration]]): a variant makes an augmented
    copy of the audio; offset and duration (seconds) read a segment of the file (None = to its end).
    Audio longer than ``max_duration_s`` (when not 0) is rejected as ``too_long``. ``key`` (the digest of
    the jobs, ``shard_key``) is stored in the part, which is valid for those jobs only."""
    utterances, lengths, durations, reasons, details, converted = [], [], [], [], [], []
    computation = feature_pipeline(features)
    empty = np.zeros((0, computation.feature_size), np.float32)
    for job in jobs:
        min_frames = job[1]
        reason = detail = ""
        frames = empty
        duration = 0.0
        how = 0
        try:
            frames, duration, how = _utterance(job, features, computation, max_duration_s)
            if not np.isfinite(frames).all():
                reason = "non_finite_features"
                detail = f"{job[0]}: the features hold NaN or Inf (corrupt samples?)"
            elif len(frames) < min_frames:
                reason = "too_short_for_transcript"
                detail = (
                    f"transcript needs at least {min_frames} time steps, "
                    f"audio gives {len(frames)} ({duration:.2f} s)"
                )
        except AudioError as error:
            reason, detail = error.reason, str(error)
        if reason:
            frames = empty
        utterances.append(frames)
        lengths.append(len(frames) if not reason else -1)
        durations.append(duration)
        reasons.append(reason)
        details.append(detail)
        converted.append(0 if reason else how)
    with atomic_path(part) as tmp, open(tmp, "wb") as handle:
        np.savez(
            handle,
            features=np.concatenate(utterances),
            lengths=np.array(lengths, np.int32),
            durations=np.array(durations, np.float32),
            reasons=np.array(reasons, dtype=str),
            details=np.array(details, dtype=str),
            converted=np.array(converted, np.int8),
            key=np.array(key),
        )
    return (
        len(jobs),
        sum(1 for r in reasons if r),
        float(sum(d for d, r in zip(durations, reasons, strict=False) if not r)),
    )


def shard_key(jobs: list[tuple]) -> str:
    """A digest of exactly what a shard is computed from: each job (audio path, minimum frames, copy,
    segment) with its audio file's size and modification time. Which rows fall into a shard depends on
    which files exist, so a part is reused only when this digest is the same."""
    digest = hashlib.sha256()
    for audio_path, min_frames, *extra in jobs:
        try:
            stat = os.stat(audio_path)
            stamp = [stat.st_size, stat.st_mtime_ns]
        except OSError:
            stamp = None
        digest.update(json.dumps([str(audio_path), stamp, int(min_frames), repr(extra)]).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def _part_summary(part: Path, key: str | None = None, count: int | None = None) -> dict | None:
    """The small arrays of a finished part (lengths, durations, reasons, details), read without its
    features; None when it is missing. A damaged part, or one made from other jobs than ``key``/``count``
    say, is removed with a warning naming it, so that it is computed again."""
    if not part.exists():
        return None
    try:
        with np.load(part, allow_pickle=False) as data:
            summary = {k: data[k] for k in ("lengths", "durations", "reasons", "details")}
            summary["converted"] = (
                data["converted"] if "converted" in data.files else np.zeros(len(summary["lengths"]), np.int8)
            )
            stored = str(data["key"]) if "key" in data.files else None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as error:
        log.warning("%s: damaged feature shard (%s); computing it again", part, error)
        part.unlink(missing_ok=True)
        return None
    if (key is not None and stored != key) or (count is not None and len(summary["lengths"]) != count):
        log.warning("%s: feature shard made from other rows; computing it again", part)
        part.unlink(missing_ok=True)
        return None
    return summary


def _part_features(part: Path) -> np.ndarray:
    """The features of a finished part (``[frames, feature_size]``, its kept utterances one after another)."""
    with np.load(part, allow_pickle=False) as data:
        return data["features"]


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


def build_split_cache(layout: Layout, split: str, progress: ProgressFn | None = None) -> FeaturesSummary:
    """Check the corpus of ``split``, compute its features and write its cache and rejects report.

    Raises CorpusError when more than ``data.max_reject_fraction`` of the rows
    are rejected (the rejects report is written first). Two pipelines that
    share this cache (same features fingerprint) take turns: the second finds
    the cache written and returns its summary.
    """
    cache = layout.features_cache(split)
    with stage_lock(cache):
        # This cache's temporaries (its own, its rejects report's, its parts') are written under this lock.
        remove_leftovers(cache.parent, LEFTOVER_PATTERNS, locked_prefixes=(f".{cache.stem}.",))
        remove_leftovers(layout.features_parts(split), LEFTOVER_PATTERNS, locked_prefixes=(".",))
        if cache.is_file():
            return _existing_summary(split, cache, layout.rejects_report(split))
        return _build_split_cache(layout, split, progress)


def _with_copies(samples: list[Sample], augment: AugmentConfig) -> tuple[list[Sample], list[tuple]]:
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


def _import_rejects(layout: Layout, split: str) -> tuple[Counter, tuple[Path, ...]]:
    """The rows the imports of ``data.corpora`` rejected for ``split``, by reason (none when
    ``data.limit_<split>`` takes only the first rows), and the rejects files that list them."""
    if layout.config.split_limit(split) or not layout.corpora:
        return Counter(), ()
    found, files = Counter(), []
    for key in layout.corpora:
        imported = layout.import_files(key)
        rejected = json.loads(imported.report.read_text(encoding="utf-8"))["rejected_by_split"][split]
        if rejected:
            found.update(rejected)
            files.append(imported.rejects)
    return found, tuple(files)


def _existing_summary(split: str, cache: Path, report: Path) -> FeaturesSummary:
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


def _build_split_cache(layout: Layout, split: str, progress: ProgressFn | None) -> FeaturesSummary:
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
    cache = layout.features_cache(split)  # the fingerprint (and the manifests' digests it used), first
    digests: dict[str, str] = {}
    samples, rejects = read_manifests(
        layout.split_manifests(split), config.split_limit(split), alphabet, config.data.text, digests
    )
    changed = layout.changed_inputs(digests)
    if changed:
        raise FeaturesError(
            f"{changed[0]}: the manifest changed after this run was scheduled (the cache name "
            f"{cache.name} comes from its earlier content); run the Features task again"
        )
    rows = len(samples) + len(rejects)  # manifest rows: what data.max_reject_fraction is a fraction of
    samples, audio_sources = _with_copies(samples, config.augment if split == "train" else AugmentConfig())
    parts_dir = layout.features_parts(split)
    parts_dir.mkdir(parents=True, exist_ok=True)

    family = model_family(config.model.architecture)  # its output rate: how many frames a label needs

    def job(position: int, sample: Sample) -> tuple:
        path, variant = audio_sources[position]
        needed = family.min_feature_frames(config.model, ctc_min_frames(sample.labels))
        return path, needed, variant, sample.offset, sample.duration

    shards = [samples[i : i + SHARD_SIZE] for i in range(0, len(samples), SHARD_SIZE)]
    jobs = [[job(i * SHARD_SIZE + k, s) for k, s in enumerate(shard)] for i, shard in enumerate(shards)]
    keys = [shard_key(shard_jobs) for shard_jobs in jobs]
    part_paths = [layout.features_part(parts_dir, index, key) for index, key in enumerate(keys)]
    _remove_other_parts(parts_dir, part_paths)
    total = len(samples) + len(rejects)
    done, rejected, seconds = len(rejects), len(rejects), 0.0

    todo = []
    for index, shard in enumerate(shards):
        part = _part_summary(part_paths[index], keys[index], len(shard))
        if part is None:
            todo.append(index)
        else:
            done += len(shard)
            rejected += int(np.sum(part["lengths"] < 0))
            seconds += float(np.sum(part["durations"][part["lengths"] >= 0]))
    if progress:
        progress(done, total, rejected, seconds)

    workers = config.features.workers or os.cpu_count() or 1
    max_duration = config.data.max_duration_s
    if workers == 1 or len(todo) <= 1:
        for index in todo:
            count, bad, secs = _process_shard(
                str(part_paths[index]), jobs[index], config.features, max_duration, keys[index]
            )
            done, rejected, seconds = done + count, rejected + bad, seconds + secs
            if progress:
                progress(done, total, rejected, seconds)
    elif todo:
        with _executor(min(workers, len(todo))) as pool:
            futures = [
                pool.submit(
                    _process_shard, str(part_paths[i]), jobs[i], config.features, max_duration, keys[i]
                )
                for i in todo
            ]
            for future in as_completed(futures):
                count, bad, secs = future.result()
                done, rejected, seconds = done + count, rejected + bad, seconds + secs
                if progress:
                    progress(done, total, rejected, seconds)

    report = layout.rejects_report(split)
    is_copy = [variant is not None for _, variant in audio_sources]
    kept_samples, durations, conversions = _merge_parts(
        layout, split, shards, part_paths, keys, rejects, is_copy, rows, report
    )
    return FeaturesSummary(
        split=split,
        cache=str(cache),
        rejects_report=str(report),
        kept=len(kept_samples),
        rejected=len(rejects),
        audio_seconds=float(sum(durations)),
        reasons=dict(Counter(r.reason for r in rejects)),
        resampled=conversions["resampled_files"],
        downmixed=conversions["downmixed_files"],
    )


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
    layout: Layout,
    split: str,
    shards: list,
    part_paths: list[Path],
    keys: list[str],
    rejects: list[Reject],
    is_copy: list[bool],
    rows: int,
    report: Path,
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
    config = layout.config
    row_rejects = list(rejects)
    # The index of every kept utterance (small: no features), then the cache in length order.
    kept: list[tuple[int, int, int]] = []  # (shard, position in shard, frames)
    kept_samples, durations = [], []
    conversions = {"resampled_files": 0, "downmixed_files": 0}
    for index, shard in enumerate(shards):
        part = _part_summary(part_paths[index], keys[index], len(shard))
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
    imported, import_rejects = _import_rejects(layout, split)
    check_reject_fraction(
        split,
        rows,
        row_rejects,
        config.data.max_reject_fraction,
        report,
        imported,
        import_rejects,
        kept=len(kept),
    )
    lengths = np.array([frames for _, _, frames in kept], np.int64)
    order = np.argsort(lengths, kind="stable")  # where each cache row comes from
    row_of = np.empty_like(order)
    row_of[order] = np.arange(len(order))  # where each kept utterance goes
    with CacheWriter(
        layout.features_cache(split),
        layout.features_fingerprint(split),
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
            frames, start = _part_features(part_paths[index]), 0
            for k in range(first, stop):
                writer.put(int(row_of[k]), frames[start : start + kept[k][2]])
                start += kept[k][2]
            first = stop
    shutil.rmtree(layout.features_parts(split), ignore_errors=True)
    return kept_samples, durations, conversions
