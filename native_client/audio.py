"""Reading audio as it comes, for training and the client alike.

Every format libsndfile decodes (WAV in any sample format, FLAC, MP3, Ogg Vorbis/Opus, NIST SPHERE,
AIFF, ...) is read as float and scaled, so that float WAVs are not silence; other sample rates are
resampled with libsoxr (``soxr``), in one call or block by block; channels are averaged; a segment
(offset, duration) is read by seeking, without decoding the audio before it. The result is int16
mono, the form the front ends take.

A file whose header claims more audio than the file holds (a truncated copy, a WAV whose data size
was never filled in) is refused as ``truncated_audio``: libsndfile quietly shortens such a file to
what is there, which would pair the whole transcript with part of the speech.
"""

from __future__ import annotations

import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
import soxr

DECODE_ERRORS = (RuntimeError, soundfile.LibsndfileError, TypeError, ValueError)
# Compressed formats whose frame count in the header may be an estimate (MP3 without an exact
# Xing/LAME header, Ogg): reading may end a little short of it without the file being damaged.
ESTIMATED_LENGTH_FORMATS = ("MP3", "OGG")
# How far a segment may run past the end of its file (seconds) and still be read up to the end:
# corpus segment times are rounded (TED-LIUM's STM to 10 ms).
SEGMENT_END_TOLERANCE_S = 0.05
RESAMPLE_QUALITY = "HQ"


class AudioError(ValueError):
    """Audio that cannot be used; ``reason`` is a short code for reports, the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class AudioInfo:
    """What the header of a sound file says (``frames`` per channel), checked against the file size."""

    path: str
    frames: int
    sample_rate: int
    channels: int
    format: str
    subtype: str

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return self.frames / self.sample_rate if self.sample_rate else 0.0


# The sample rates a file's header may claim: below, resampling stretches a few bytes into hours of
# audio; above, one read block holds the whole file.
HEADER_RATES = (1000, 384000)


def probe(path: str | Path) -> AudioInfo:
    """Read the header of ``path`` (never the audio): frames, rate, channels, format.

    Raises AudioError with reason ``missing_file``, ``empty_audio`` (0 bytes or no frames),
    ``unreadable_audio`` (not a format libsndfile decodes, the message naming shorten-compressed
    SPHERE, which needs converting; or a sample rate outside ``HEADER_RATES``) or ``truncated_audio``
    (a WAV or SPHERE header that claims more samples than the file holds).
    """
    path = Path(path)
    try:
        status = path.stat()
    except FileNotFoundError:
        raise AudioError("missing_file", f"{path}: no such file") from None
    except OSError as error:
        raise AudioError("missing_file", f"{path}: cannot read: {error.strerror}") from error
    size = status.st_size
    if stat.S_ISDIR(status.st_mode):
        raise AudioError("unreadable_audio", f"{path}: is a directory, not an audio file")
    if not stat.S_ISREG(status.st_mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(status.st_mode) else "a device or socket"
        raise AudioError(
            "unreadable_audio", f"{path}: is {kind}, not an audio file (write the audio to a file first)"
        )
    if size == 0:
        raise AudioError("empty_audio", f"{path}: empty file (0 bytes)")
    try:
        info = soundfile.info(str(path))
    except DECODE_ERRORS as error:
        raise AudioError(
            "unreadable_audio", f"{path}: cannot decode audio: {_unreadable_hint(path, error)}"
        ) from error
    _check_header_claim(path, size)
    low, high = HEADER_RATES
    if not low <= info.samplerate <= high:
        raise AudioError(
            "unreadable_audio",
            f"{path}: the header says {info.samplerate} Hz; expected {low} to {high} Hz (a damaged or forged "
            "header: its audio would be stretched or squeezed thousands of times)",
        )
    if info.frames <= 0:
        raise AudioError("empty_audio", f"{path}: no audio samples (header only)")
    return AudioInfo(
        str(path), int(info.frames), int(info.samplerate), int(info.channels), info.format, info.subtype
    )


def _unreadable_hint(path: Path, error: Exception) -> str:
    coding = _nist_header(path).get("sample_coding", "") if _is_nist(path) else ""
    if "shorten" in coding:
        return (
            f"NIST SPHERE compressed with shorten ({coding}), which libsndfile does not decode; "
            "convert it once (sph2pipe -f wav, or ffmpeg)"
        )
    return f"not a sound file libsndfile reads (WAV, FLAC, MP3, OGG, SPHERE, ...): {error}"


def _check_header_claim(path: Path, size: int) -> None:
    """Raise truncated_audio when a WAV or SPHERE header claims more sample bytes than the file holds.

    libsndfile reports such a file at the length actually present (a warning in its log only), so
    the claim is read here from the header itself: RIFF chunks (or the RF64 ``ds64`` size) and
    SPHERE's ``sample_count``. Python's ``wave`` reads only integer PCM, hence this small parser."""
    claim = _wav_data_claim(path, size) if not _is_nist(path) else _nist_data_claim(path, size)
    if claim is None:
        return
    claimed, available, frame_bytes = claim
    if claimed == 0 and available >= 4 * frame_bytes:
        what = "a data size of 0 with sample bytes after it (a stream writer's header, never filled in)"
    elif claimed <= available:
        return
    elif claimed in (0xFFFFFFFF, 0xFFFFFFFF - 1):
        what = f"a data size of {claimed:#x} (a stream writer's placeholder, never filled in)"
    else:
        what = f"{claimed // max(frame_bytes, 1)} frames ({claimed} bytes)"
    raise AudioError(
        "truncated_audio",
        f"{path}: header claims {what}, the file holds {available // max(frame_bytes, 1)} frames "
        f"({available} bytes): a truncated copy or an unfinished header; re-create the file "
        "(e.g. sox in.wav out.wav rewrites the header) or leave it out",
    )


def _wav_data_claim(path: Path, size: int) -> tuple[int, int, int] | None:
    """(data bytes claimed, data bytes present, bytes per frame) of a RIFF/RIFX/RF64 WAVE file, else None."""
    with open(path, "rb") as handle:
        head = handle.read(12)
        if len(head) < 12 or head[:4] not in (b"RIFF", b"RIFX", b"RF64") or head[8:12] != b"WAVE":
            return None
        order = ">" if head[:4] == b"RIFX" else "<"
        position, frame_bytes, data64 = 12, 1, None
        for _ in range(256):  # a real file has a handful of chunks before its data
            handle.seek(position)
            chunk = handle.read(8)
            if len(chunk) < 8:
                return None
            name, length = chunk[:4], struct.unpack(order + "I", chunk[4:])[0]
            if name == b"fmt ":
                body = handle.read(16)
                if len(body) >= 14:
                    frame_bytes = struct.unpack(order + "H", body[12:14])[0] or 1
            elif name == b"ds64":
                body = handle.read(16)
                if len(body) == 16:
                    data64 = struct.unpack("<Q", body[8:16])[0]
            elif name == b"data":
                if head[:4] == b"RF64" and length == 0xFFFFFFFF and data64 is not None:
                    length = data64
                return length, size - position - 8, frame_bytes
            position += 8 + length + (length & 1)
    return None


def _is_nist(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(8) == b"NIST_1A\n"


def _nist_header(path: Path) -> dict[str, str]:
    """The fields of a NIST SPHERE header (``name -type value`` lines up to ``end_head``)."""
    with open(path, "rb") as handle:
        head = handle.read(1024)
    lines = head.decode("ascii", "replace").split("\n")
    fields = {"_header_bytes": lines[1].strip() if len(lines) > 1 else "1024"}
    for line in lines[2:]:
        if line.startswith("end_head"):
            break
        parts = line.split(None, 2)
        if len(parts) == 3:
            fields[parts[0]] = parts[2].strip()
    return fields


def _nist_data_claim(path: Path, size: int) -> tuple[int, int, int] | None:
    fields = _nist_header(path)
    try:
        header = int(fields["_header_bytes"])
        frame_bytes = int(fields.get("sample_n_bytes", "2")) * int(fields.get("channel_count", "1"))
        claimed = int(fields["sample_count"]) * frame_bytes
    except (KeyError, ValueError):
        return None
    if "shorten" in fields.get("sample_coding", ""):
        return None  # compressed: the sample count does not translate into bytes
    return claimed, size - header, frame_bytes


def _segment_frames(info: AudioInfo, offset: float, duration: float | None) -> tuple[int, int]:
    """(first frame, frame count) of a segment; AudioError ``segment_out_of_range`` outside the file."""
    rate = info.sample_rate
    start = int(round(offset * rate))
    if offset < 0 or (duration is not None and duration <= 0):
        raise AudioError(
            "segment_out_of_range",
            f"{info.path}: segment offset {offset:g} s, duration {duration} s is not valid",
        )
    count = info.frames - start if duration is None else int(round(duration * rate))
    end = start + count
    if start >= info.frames or end - info.frames > SEGMENT_END_TOLERANCE_S * rate:
        raise AudioError(
            "segment_out_of_range",
            f"{info.path}: segment {offset:g} s to {end / rate:g} s runs past the end of the audio "
            f"({info.duration:.3f} s)",
        )
    return start, min(count, info.frames - start)


def _check_length(info: AudioInfo, expected: int, got: int) -> None:
    """Raise truncated_audio when fewer frames were decoded than the header promised."""
    tolerance = 0
    if info.format in ESTIMATED_LENGTH_FORMATS:
        tolerance = max(expected // 50, info.sample_rate // 10)
    if got < expected - tolerance:
        raise AudioError(
            "truncated_audio",
            f"{info.path}: the header promises {expected} frames ({expected / info.sample_rate:.3f} s), "
            f"only {got} ({got / info.sample_rate:.3f} s) could be decoded: the file is truncated",
        )


def read_samples(
    path: str | Path, offset: float = 0.0, duration: float | None = None, info: AudioInfo | None = None
) -> tuple[np.ndarray, int]:
    """Float samples ``[frames, channels]`` in [-1, 1] of ``path`` (or of the segment starting at
    ``offset`` seconds, lasting ``duration``; None = to the end) and the file's sample rate.

    Integer formats are scaled by libsndfile; float formats come as stored. The segment is reached
    by seeking (FLAC, WAV, SPHERE seek exactly; MP3 through its seek index). Raises AudioError (see
    ``probe``; also ``segment_out_of_range``, and ``truncated_audio`` when decoding ends early).
    ``info``: the file's header when the caller has already probed it."""
    info = info or probe(path)
    start, count = _segment_frames(info, offset, duration)
    try:
        with soundfile.SoundFile(str(path)) as handle:
            if start:
                handle.seek(start)
            samples = handle.read(count, dtype="float32", always_2d=True)
    except DECODE_ERRORS as error:
        raise AudioError("unreadable_audio", f"{path}: cannot decode audio: {error}") from error
    _check_length(info, count, len(samples))
    check_finite(samples, path, start, info.sample_rate)
    return samples, info.sample_rate


def check_finite(samples: np.ndarray, path: str | Path, first_frame: int, rate: int) -> None:
    """AudioError ``non_finite_audio`` naming ``path`` when float ``samples`` (``[frames, channels]``,
    the first at frame ``first_frame``) hold a NaN or an infinity: a float WAV can, and cast to int16
    they would be garbage."""
    bad = ~np.isfinite(samples).all(axis=1)
    if bad.any():
        frame = int(np.argmax(bad))
        value = samples[frame][~np.isfinite(samples[frame])][0]
        raise AudioError(
            "non_finite_audio",
            f"{path}: the sample at {(first_frame + frame) / rate:.3f} s is {value}: not audio "
            "(a float file holding NaN or infinity)",
        )


def to_mono(samples: np.ndarray) -> np.ndarray:
    """Average the channels of ``[frames, channels]`` float samples into ``[frames]``."""
    if samples.shape[1] == 1:
        return np.ascontiguousarray(samples[:, 0])
    return samples.mean(axis=1, dtype=np.float32)


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] as int16 (x 32768, rounded, clipped): exact for audio that was 16-bit."""
    return np.clip(np.round(np.asarray(samples, np.float32) * 32768.0), -32768, 32767).astype(np.int16)


def resample(samples: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    """Float mono samples from ``rate`` to ``target_rate`` with libsoxr (band-limited, high quality)."""
    if rate == target_rate or len(samples) == 0:
        return samples
    return soxr.resample(samples, rate, target_rate, quality=RESAMPLE_QUALITY)


def _check_shape(
    info: AudioInfo, sample_rate: int, convert_rate: bool, downmix: bool, convert_hint: str, downmix_hint: str
) -> None:
    if info.channels > 1 and not downmix:
        raise AudioError(
            "too_many_channels",
            f"{info.path}: {info.channels} channels, expected mono"
            + (f" ({downmix_hint})" if downmix_hint else ""),
        )
    if info.sample_rate != sample_rate and not convert_rate:
        raise AudioError(
            "wrong_sample_rate",
            f"{info.path}: sample rate {info.sample_rate} Hz, expected {sample_rate} Hz"
            + (f" ({convert_hint})" if convert_hint else ""),
        )


def load_checked(
    path: str | Path,
    sample_rate: int,
    *,
    offset: float = 0.0,
    duration: float | None = None,
    convert_rate: bool = False,
    downmix: bool = True,
    convert_hint: str = "",
    downmix_hint: str = "",
) -> np.ndarray:
    """Read ``path`` (or its segment ``offset``/``duration`` in seconds) as int16 mono at
    ``sample_rate``: the one audio check of training and inference.

    Raises AudioError with reason ``missing_file``, ``unreadable_audio``, ``empty_audio``,
    ``truncated_audio``, ``segment_out_of_range``, ``too_many_channels`` (unless ``downmix``, which
    averages the channels) or ``wrong_sample_rate`` (unless ``convert_rate``, which resamples). The
    hints say how the caller's user turns conversion on (a config key, a flag).
    """
    info = probe(path)
    _check_shape(info, sample_rate, convert_rate, downmix, convert_hint, downmix_hint)
    samples, rate = read_samples(path, offset, duration, info)
    if len(samples) == 0:
        raise AudioError("empty_audio", f"{path}: no audio samples in the segment")
    return to_int16(resample(to_mono(samples), rate, sample_rate))


@dataclass(frozen=True)
class CheckedAudio:
    """A sound file, or a segment of it, whose header passed the checks of ``open_checked``: ready to be
    read block by block (``blocks``), so that a long recording is never in memory whole."""

    path: str
    info: AudioInfo
    start: int  # first frame of the segment, at the file's rate
    count: int  # frames of the segment, at the file's rate
    sample_rate: int  # the rate the blocks come at

    @property
    def seconds(self) -> float:
        """The segment's length in seconds, as the header says."""
        return self.count / self.info.sample_rate

    @property
    def resampled(self) -> bool:
        """Whether the blocks are resampled from the file's rate."""
        return self.info.sample_rate != self.sample_rate

    def blocks(self, block_seconds: float = 10.0) -> Iterator[np.ndarray]:
        """int16 mono blocks of about ``block_seconds`` at ``sample_rate`` (libsoxr's stream keeps the
        filter state between blocks); AudioError ``unreadable_audio``, ``truncated_audio`` (decoding
        ended before the header's length) or ``empty_audio`` (nothing decoded)."""
        rate = self.info.sample_rate
        stream = None
        if self.resampled:
            stream = soxr.ResampleStream(rate, self.sample_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY)
        decoded = 0
        try:
            for block in soundfile.blocks(
                self.path,
                blocksize=max(1, int(block_seconds * rate)),
                start=self.start,
                frames=self.count,
                dtype="float32",
                always_2d=True,
            ):
                check_finite(block, self.path, self.start + decoded, rate)
                decoded += len(block)
                mono = to_mono(block)
                if stream is not None:
                    mono = stream.resample_chunk(mono)
                if len(mono):
                    yield to_int16(mono)
        except AudioError:
            raise
        except DECODE_ERRORS as error:
            raise AudioError("unreadable_audio", f"{self.path}: cannot decode audio: {error}") from error
        _check_length(self.info, self.count, decoded)
        if decoded == 0:
            raise AudioError("empty_audio", f"{self.path}: no audio samples in the segment")
        if stream is not None:
            tail = stream.resample_chunk(np.zeros(0, np.float32), last=True)
            if len(tail):
                yield to_int16(tail)


def open_checked(
    path: str | Path,
    sample_rate: int,
    *,
    offset: float = 0.0,
    duration: float | None = None,
    convert_rate: bool = False,
    downmix: bool = True,
    convert_hint: str = "",
    downmix_hint: str = "",
) -> CheckedAudio:
    """``load_checked``'s checks on the header only (nothing decoded yet): the file, or its segment
    ``offset``/``duration`` in seconds, to be read in blocks with ``CheckedAudio.blocks``. Raises the same
    AudioErrors as ``load_checked`` for what the header tells."""
    info = probe(path)
    _check_shape(info, sample_rate, convert_rate, downmix, convert_hint, downmix_hint)
    start, count = _segment_frames(info, offset, duration)
    return CheckedAudio(str(path), info, start, count, int(sample_rate))


def stream_for_model(
    path: str | Path,
    sample_rate: int,
    convert_rate: bool = False,
    block_seconds: float = 10.0,
    on_resample=None,
) -> Iterator[np.ndarray]:
    """``load_for_model`` in blocks of about ``block_seconds`` (int16 mono), so that a long recording is
    never in memory whole, resampled or not; the same checks and errors. ``on_resample(rate)`` is called
    first when the file is resampled."""
    audio = open_checked(
        path,
        sample_rate,
        convert_rate=convert_rate,
        convert_hint="without --no-resample the client resamples it; accuracy may suffer",
    )
    if audio.resampled and on_resample is not None:
        on_resample(audio.info.sample_rate)
    yield from audio.blocks(block_seconds)


def load_for_model(path: str | Path, sample_rate: int, convert_rate: bool = False) -> np.ndarray:
    """Read ``path`` for a model trained at ``sample_rate``: channels are averaged; another rate is
    refused with AudioError("wrong_sample_rate") unless ``convert_rate``, which resamples."""
    return load_checked(
        path,
        sample_rate,
        convert_rate=convert_rate,
        convert_hint="without --no-resample the client resamples it; accuracy may suffer",
    )
