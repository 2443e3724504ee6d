"""The HDF5 feature cache: one file per split, written as it is filled, read batch by batch.

Layout (format 3; 3 records the front end's type with its settings):
``features`` float32 ``[total_frames, feature_size]``, chunked, holding
every utterance in **length order** (shortest first, manifest order
among equals), so that a batch of similar lengths is one contiguous read;
``offsets``/``lengths`` (frames) per utterance, ``labels`` (variable-length
int32), ``transcripts``, ``paths``, ``durations``. The attributes record the
fingerprint, the feature settings and the float64 sums of the frames (``frame_count``, ``frame_sum``,
``frame_square_sum``: the train split's give ``features.normalize: global`` its statistics).

Every numeric dataset is chunked with HDF5's fletcher32 filter: each chunk
carries a checksum that HDF5 verifies on every read, so a damaged file is
refused (``CacheError`` naming it) instead of feeding garbage to training.
Strings and labels live in HDF5's heap, which the filter does not cover.

Only the per-utterance index (``CacheIndex``) is ever held in memory; the
features stay on disk and are read per batch (``FeatureReader``), with the
operating system's page cache doing the caching.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from pipeline.config import FeaturesConfig
from pipeline.features.frontend import feature_pipeline
from pipeline.files import atomic_path

FORMAT_VERSION = 3
CHUNK_FRAMES = 4096


class CacheError(ValueError):
    """A cache file is missing, incomplete or was made with other settings."""


DAMAGED_REMEDY = "delete it and run the Features task again (make rerun STAGE=Features)"


def damaged(path: Path, error: Exception) -> CacheError:
    """The one-line error for a cache whose checksums or structure do not verify."""
    return CacheError(f"{path}: feature cache is damaged ({error}); {DAMAGED_REMEDY}")


def damage_in(error: Exception) -> CacheError | None:
    """The cache damage a TensorFlow error carries (a reader raised it inside tf.data), else None."""
    match = re.search(
        r"(\S+: feature cache is damaged \(.*?\); " + re.escape(DAMAGED_REMEDY) + ")", str(error)
    )
    return CacheError(match.group(1)) if match else None


def _checksummed(h5: h5py.File, name: str, data: np.ndarray) -> None:
    """Write ``data`` as a chunked dataset with HDF5's fletcher32 checksum."""
    h5.create_dataset(
        name,
        data=data,
        chunks=(max(1, min(len(data), 65536)),) if len(data) else None,
        fletcher32=bool(len(data)),
    )


@dataclass
class CacheIndex:
    """A split's per-utterance index (what lives in memory); the features stay in ``path``."""

    path: Path
    n_input: int
    offsets: np.ndarray  # [n] int64 first frame of each utterance
    lengths: np.ndarray  # [n] int32 frames
    labels: list[np.ndarray]  # n x [label_len] int32
    transcripts: list[str]
    paths: list[str]
    durations: np.ndarray  # [n] float32 seconds

    def __len__(self) -> int:
        return len(self.lengths)

    def reader(self) -> FeatureReader:
        """A reader of this cache's features (open one per process or thread that reads)."""
        return FeatureReader(self.path, self.offsets, self.lengths, self.n_input)


class FeatureReader:
    """Reads utterances' features from a cache file: a run of consecutive utterances is one read. Frames
    come as the front end computed them: global normalisation is the model's (``pipeline.model``)."""

    def __init__(
        self,
        path: Path,
        offsets: np.ndarray,
        lengths: np.ndarray,
        n_input: int,
    ):
        self.path = Path(path)
        self.offsets = offsets
        self.lengths = lengths
        self.n_input = n_input
        self._file = None

    def _features(self) -> h5py.Dataset:
        if self._file is None:
            try:
                self._file = h5py.File(self.path, "r")
            except OSError as error:
                raise damaged(self.path, error) from None
        return self._file["features"]

    def _read(self, start: int, stop: int) -> np.ndarray:
        # HDF5 verifies each chunk's fletcher32 checksum here.
        try:
            frames = self._features()[start:stop]
        except OSError as error:
            raise damaged(self.path, error) from None
        return frames

    def utterance(self, index: int) -> np.ndarray:
        """The ``[frames, n_input]`` features of one utterance."""
        start = int(self.offsets[index])
        return self._read(start, start + int(self.lengths[index]))

    def batch(self, indices: np.ndarray, frames: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Zero-padded features ``[batch, max(frames, longest), n_input]`` and lengths ``[batch]`` of
        ``indices``."""
        indices = np.asarray(indices, dtype=np.int64)
        lengths = self.lengths[indices].astype(np.int32)
        out = np.zeros((len(indices), max(frames, int(lengths.max(initial=0))), self.n_input), np.float32)
        for first, last in _runs(indices):
            start = int(self.offsets[indices[first]])
            stop = int(self.offsets[indices[last]] + self.lengths[indices[last]])
            run = self._read(start, stop)
            for row in range(first, last + 1):
                begin = int(self.offsets[indices[row]]) - start
                out[row, : lengths[row]] = run[begin : begin + lengths[row]]
        return out, lengths

    def close(self) -> None:
        """Close the file (a later read opens it again)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _runs(indices: np.ndarray) -> Iterator[tuple[int, int]]:
    """(first, last) positions of the runs of consecutive values in ``indices``."""
    first = 0
    for position in range(1, len(indices) + 1):
        if position == len(indices) or indices[position] != indices[position - 1] + 1:
            yield first, position - 1
            first = position


def recorded_settings(features: FeaturesConfig) -> dict:
    """The feature settings recorded in (and checked against) a cache: the front end's type and
    settings, the sample rate and normalisation, as the export's metadata records them."""
    return feature_pipeline(features).to_dict()


class CacheWriter:
    """Writes a cache whose index is known up front and whose utterances arrive in any order.

    ``with CacheWriter(...) as writer: writer.put(i, frames)`` for every
    utterance ``i`` of the index; the file is written under a temporary name and
    renamed into place only when the block ends normally with every utterance
    written, so a crash leaves nothing a reader would trust.
    """

    def __init__(
        self,
        path: Path,
        fingerprint: str,
        features: FeaturesConfig,
        lengths: np.ndarray,
        labels: list,
        transcripts: list[str],
        paths: list[str],
        durations: np.ndarray,
        counts: dict[str, int] | None = None,
    ):
        self.path = Path(path)
        self.counts = dict(counts or {})  # recorded as attributes (resampled_files, ...)
        self.fingerprint = fingerprint
        self.features = features
        self.lengths = np.asarray(lengths, dtype=np.int32)
        self.offsets = (
            np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)[:-1]]).astype(np.int64)
            if len(self.lengths)
            else np.zeros(0, np.int64)
        )
        self.labels, self.transcripts, self.paths = labels, transcripts, paths
        self.durations = np.asarray(durations, dtype=np.float32)
        self._written = np.zeros(len(self.lengths), bool)
        self._sums: tuple[int, np.ndarray, np.ndarray] | None = None  # frames, sum, sum of squares

    def __enter__(self) -> CacheWriter:
        self._atomic = atomic_path(self.path)
        tmp = self._atomic.__enter__()
        try:
            self._h5 = h5py.File(tmp, "w")
            total, numcep = int(self.lengths.sum()), feature_pipeline(self.features).feature_size
            self._data = self._h5.create_dataset(
                "features",
                shape=(total, numcep),
                dtype=np.float32,
                chunks=(min(max(total, 1), CHUNK_FRAMES), numcep) if total else None,
                fletcher32=bool(total),
            )
            h5 = self._h5
            _checksummed(h5, "offsets", self.offsets)
            _checksummed(h5, "lengths", self.lengths)
            label_array = np.empty(len(self.labels), dtype=object)
            label_array[:] = [np.asarray(label, np.int32) for label in self.labels]
            h5.create_dataset("labels", data=label_array, dtype=h5py.vlen_dtype(np.int32))
            h5.create_dataset(
                "transcripts", data=np.array(self.transcripts, dtype=object), dtype=h5py.string_dtype()
            )
            h5.create_dataset("paths", data=np.array(self.paths, dtype=object), dtype=h5py.string_dtype())
            _checksummed(h5, "durations", self.durations)
        except BaseException as error:
            self._abort(error)
            raise
        return self

    def put(self, index: int, frames: np.ndarray) -> None:
        """Write utterance ``index`` (``[lengths[index], numcep]`` frames)."""
        if len(frames) != self.lengths[index]:
            raise CacheError(
                f"{self.path}: utterance {index} has {len(frames)} frames, the index says "
                f"{self.lengths[index]}"
            )
        if not np.isfinite(frames).all():
            raise CacheError(f"{self.path}: utterance {index} ({self.paths[index]}) has non-finite features")
        start = int(self.offsets[index])
        self._data[start : start + len(frames)] = frames
        self._written[index] = True
        wide = np.asarray(frames, np.float64)
        count, total, squares = self._sums or (0, 0.0, 0.0)
        self._sums = (count + len(frames), total + wide.sum(axis=0), squares + np.square(wide).sum(axis=0))

    def __exit__(self, kind, error, traceback) -> None:
        if error is None and not self._written.all():
            error = CacheError(f"{self.path}: {int((~self._written).sum())} utterances were never written")
            self._abort(error)
            raise error
        if error is not None:
            self._abort(error)
            return
        h5 = self._h5
        h5.attrs["format_version"] = FORMAT_VERSION
        h5.attrs["fingerprint"] = self.fingerprint
        h5.attrs["feature_settings"] = json.dumps(recorded_settings(self.features), sort_keys=True)
        h5.attrs["audio_seconds"] = float(np.sum(self.durations, dtype=np.float64))
        for name, count in self.counts.items():
            h5.attrs[name] = int(count)
        if self._sums is not None:
            count, total, squares = self._sums
            h5.attrs["frame_count"] = int(count)
            h5.attrs["frame_sum"] = np.asarray(total, np.float64)
            h5.attrs["frame_square_sum"] = np.asarray(squares, np.float64)
        h5.close()
        self._atomic.__exit__(None, None, None)

    def _abort(self, error: BaseException) -> None:
        h5 = getattr(self, "_h5", None)
        if h5 is not None:
            h5.close()
        self._atomic.__exit__(type(error), error, error.__traceback__)


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
    wanted = json.loads(json.dumps(recorded_settings(features)))  # as recorded: tuples become lists
    differ = [
        f"{key}: cache {recorded.get(key)!r} vs config {wanted[key]!r}"
        for key in sorted(wanted)
        if recorded.get(key) != wanted[key]
    ]
    if differ:
        raise CacheError(f"{path}: made with other feature settings ({'; '.join(differ)}); rerun Features")


def read_cache(path: Path, features: FeaturesConfig) -> CacheIndex:
    """The per-utterance index of a cache, after checking its settings match ``features``;
    the features themselves are read later, batch by batch."""
    path = Path(path)
    if not path.exists():
        raise CacheError(f"{path}: feature cache does not exist; run the Features task")
    check_settings(path, features)
    try:
        index = _read_index(path)
    except (OSError, KeyError) as error:
        raise damaged(path, error) from None
    if len(index) == 0:
        # Features refuses to write one now; an empty split would score a perfect WER, or crash training.
        raise CacheError(
            f"{path}: the feature cache holds no utterance (every row of its split was rejected; see the "
            f"rejects report beside it); fix the corpus and run the Features task again"
        )
    return index


def _read_index(path: Path) -> CacheIndex:
    with h5py.File(path, "r") as h5:
        return CacheIndex(
            path=path,
            n_input=int(h5["features"].shape[1]),
            offsets=h5["offsets"][...].astype(np.int64),
            lengths=h5["lengths"][...].astype(np.int32),
            labels=[np.asarray(label, np.int32) for label in h5["labels"][...]],
            transcripts=[t.decode() if isinstance(t, bytes) else t for t in h5["transcripts"][...]],
            paths=[p.decode() if isinstance(p, bytes) else p for p in h5["paths"][...]],
            durations=h5["durations"][...],
        )


def cache_summary(path: Path) -> dict:
    """Sample count, audio seconds, fingerprint, and the utterances read resampled and downmixed
    (``resampled_files``, ``downmixed_files``; 0 in a cache that did not record them) of a cache,
    without loading features."""
    with h5py.File(path, "r") as h5:
        return {
            "samples": int(h5["lengths"].shape[0]),
            "audio_seconds": float(h5.attrs["audio_seconds"]),
            "fingerprint": str(h5.attrs["fingerprint"]),
            "resampled_files": int(h5.attrs.get("resampled_files", 0)),
            "downmixed_files": int(h5.attrs.get("downmixed_files", 0)),
        }


def frame_sums(path: Path) -> tuple[int, np.ndarray, np.ndarray]:
    """The number of frames of a cache and the float64 sums of their coefficients and of their squares,
    as its writer recorded them. CacheError naming the cache when it is missing or holds none."""
    if not Path(path).is_file():
        raise CacheError(
            f"{path}: feature cache does not exist (features.normalize: global takes its statistics from "
            f"the train split's); run the Features task"
        )
    try:
        with h5py.File(path, "r") as h5:
            count = int(h5.attrs["frame_count"])
            total = np.asarray(h5.attrs["frame_sum"], np.float64)
            squares = np.asarray(h5.attrs["frame_square_sum"], np.float64)
    except KeyError:
        raise CacheError(
            f"{path}: the feature cache records no frame statistics (written by an older version); "
            f"{DAMAGED_REMEDY}"
        ) from None
    except OSError as error:
        raise damaged(Path(path), error) from None
    return count, total, squares
