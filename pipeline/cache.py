"""The HDF5 feature cache: one file per split, written atomically, read with a settings check.

Layout: ``features`` float32 ``[total_frames, numcep]`` (all utterances
concatenated), ``offsets``/``lengths`` (frames) per utterance, ``labels``
(variable-length int32), ``transcripts``, ``paths``, ``durations``. The
attributes record the fingerprint and the feature settings.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from pipeline.config import FeaturesConfig
from pipeline.files import atomic_path

FORMAT_VERSION = 1


class CacheError(ValueError):
    """A cache file is missing, incomplete or was made with other settings."""


@dataclass
class CachedSplit:
    """A split's features in memory."""

    features: np.ndarray      # [total_frames, numcep] float32
    offsets: np.ndarray       # [n] int64
    lengths: np.ndarray       # [n] int32 frames
    labels: list[np.ndarray]  # n x [label_len] int32
    transcripts: list[str]
    paths: list[str]
    durations: np.ndarray     # [n] float32 seconds

    def __len__(self) -> int:
        return len(self.lengths)

    def utterance(self, index: int) -> np.ndarray:
        """The ``[frames, numcep]`` features of one utterance."""
        start = self.offsets[index]
        return self.features[start:start + self.lengths[index]]


def recorded_settings(features: FeaturesConfig) -> dict:
    """The feature settings recorded in (and checked against) a cache."""
    return {f.name: getattr(features, f.name) for f in dataclasses.fields(features)
            if f.metadata.get("fingerprint", True)}


def write_cache(path: Path, fingerprint: str, features: FeaturesConfig, utterances: list[np.ndarray],
                labels: list, transcripts: list[str], paths: list[str], durations: list[float]) -> None:
    """Write a cache under a temporary name, then rename it into place (a crash leaves nothing trusted)."""
    lengths = np.array([len(u) for u in utterances], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]]) if len(lengths) else np.zeros(0, np.int64)
    numcep = features.numcep
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as h5:
            total = int(lengths.sum())
            data = h5.create_dataset("features", shape=(total, numcep), dtype=np.float32,
                                     chunks=(min(max(total, 1), 4096), numcep) if total else None)
            for offset, utterance in zip(offsets, utterances):
                data[offset:offset + len(utterance)] = utterance
            h5["offsets"] = offsets.astype(np.int64)
            h5["lengths"] = lengths
            label_array = np.empty(len(labels), dtype=object)
            label_array[:] = [np.asarray(l, np.int32) for l in labels]
            h5.create_dataset("labels", data=label_array, dtype=h5py.vlen_dtype(np.int32))
            h5.create_dataset("transcripts", data=np.array(transcripts, dtype=object), dtype=h5py.string_dtype())
            h5.create_dataset("paths", data=np.array(paths, dtype=object), dtype=h5py.string_dtype())
            h5["durations"] = np.asarray(durations, dtype=np.float32)
            h5.attrs["format_version"] = FORMAT_VERSION
            h5.attrs["fingerprint"] = fingerprint
            h5.attrs["feature_settings"] = json.dumps(recorded_settings(features), sort_keys=True)
            h5.attrs["audio_seconds"] = float(np.sum(durations))


def check_settings(path: Path, features: FeaturesConfig) -> None:
    """Raise CacheError naming every feature setting that differs between the cache and ``features``."""
    try:
        with h5py.File(path, "r") as h5:
            recorded = json.loads(h5.attrs["feature_settings"])
            version = int(h5.attrs.get("format_version", -1))
    except (OSError, KeyError) as error:
        raise CacheError(f"{path}: not a complete feature cache ({error})") from error
    if version != FORMAT_VERSION:
        raise CacheError(f"{path}: cache format version {version}, expected {FORMAT_VERSION}; rerun Features")
    wanted = recorded_settings(features)
    differ = [f"{key}: cache {recorded.get(key)!r} vs config {wanted[key]!r}"
              for key in sorted(wanted) if recorded.get(key) != wanted[key]]
    if differ:
        raise CacheError(f"{path}: made with other feature settings ({'; '.join(differ)}); rerun Features")


def read_cache(path: Path, features: FeaturesConfig) -> CachedSplit:
    """Load a whole cache into memory after checking its settings match ``features``."""
    path = Path(path)
    if not path.exists():
        raise CacheError(f"{path}: feature cache does not exist; run the Features task")
    check_settings(path, features)
    with h5py.File(path, "r") as h5:
        return CachedSplit(
            features=h5["features"][...],
            offsets=h5["offsets"][...],
            lengths=h5["lengths"][...],
            labels=[np.asarray(l, np.int32) for l in h5["labels"][...]],
            transcripts=[t.decode() if isinstance(t, bytes) else t for t in h5["transcripts"][...]],
            paths=[p.decode() if isinstance(p, bytes) else p for p in h5["paths"][...]],
            durations=h5["durations"][...],
        )


def cache_summary(path: Path) -> dict:
    """Sample count, audio seconds and fingerprint of a cache, without loading features."""
    with h5py.File(path, "r") as h5:
        return {"samples": int(h5["lengths"].shape[0]), "audio_seconds": float(h5.attrs["audio_seconds"]),
                "fingerprint": str(h5.attrs["fingerprint"])}
