"""One shard of the Features work: each utterance's features, the too-short check, the shard's part file.

A shard's finished features are saved as its own ``.npz`` part (written under a
temporary name, then renamed), whose name and content carry a digest of exactly
the rows it was computed from (``shard_key``), so a killed run resumes with the
finished shards and a part is reused only for the very same rows.

A long file's features are computed block by block (the front ends stream
frame-exactly), so memory does not grow with one file's length beyond its
frames.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from pathlib import Path

import numpy as np

from native_client.audio import AudioError, open_checked
from pipeline.config import FeaturesConfig
from pipeline.features.audio_augment import apply_variant
from pipeline.features.frontend import feature_pipeline
from pipeline.files import atomic_path

log = logging.getLogger(__name__)

# Bits of a shard's ``converted`` array: how an utterance's audio was read.
RESAMPLED, DOWNMIXED = 1, 2


# Seconds of audio read (and featurised) at once: a long file is never in memory whole.
AUDIO_BLOCK_S = 20.0


def too_short_for_transcript(frames: int, min_frames: int, duration: float) -> str:
    """The reject detail when ``frames`` feature frames (``duration`` seconds) are too few for a transcript
    that needs ``min_frames`` (the objective's ``min_outputs`` at the family's rate); "" when enough."""
    if frames < min_frames:
        return f"transcript needs at least {min_frames} time steps, audio gives {frames} ({duration:.2f} s)"
    return ""


def utterance_features(
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
        frames = computation.utterance_frames(samples)
    else:
        frames, count = computation.frames_of_blocks(audio.blocks(AUDIO_BLOCK_S))
    duration = count / features.sample_rate
    if max_duration_s and duration > max_duration_s:
        raise too_long(duration)
    return frames, duration, RESAMPLED * audio.resampled | DOWNMIXED * (audio.info.channels > 1)


def process_shard(
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
            frames, duration, how = utterance_features(job, features, computation, max_duration_s)
            if not np.isfinite(frames).all():
                reason = "non_finite_features"
                detail = f"{job[0]}: the features hold NaN or Inf (corrupt samples?)"
            else:
                detail = too_short_for_transcript(len(frames), min_frames, duration)
                reason = "too_short_for_transcript" if detail else ""
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


def part_summary(part: Path, key: str | None = None, count: int | None = None) -> dict | None:
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


def part_features(part: Path) -> np.ndarray:
    """The features of a finished part (``[frames, feature_size]``, its kept utterances one after another)."""
    with np.load(part, allow_pickle=False) as data:
        return data["features"]
