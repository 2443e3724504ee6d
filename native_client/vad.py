"""Voice activity detection: cutting a stream of audio into utterances at pauses, skipping silence.

The detector is WebRTC's (``webrtcvad``, from the maintained ``webrtcvad-wheels`` build): a GMM over
sub-band energies, 10/20/30 ms frames at 8, 16, 32 or 48 kHz, a few microseconds a frame, no model file.
Silero's VAD is more accurate on noisy speech but is a neural network needing onnxruntime; the front end's
energy alone cannot tell speech from steady noise. docs/CLIENT.md "Voice activity" has the figures.

``Segmenter`` turns the detector's frame decisions into utterances, for the server (an utterance ends
at a pause, its result is sent) and the client's ``--vad`` (long files in bounded memory):

- idle, the last ``pre_roll_s`` of audio is kept (so the start of a word the detector was slow to
  call speech is not lost) and older audio is skipped;
- ``start_frames`` speech frames among the last ``start_window`` frames start an utterance with that
  kept audio;
- ``end_silence_s`` of frames without speech end it (the pause stays in it, its end is where the pause
  reached that length); past ``soft_max_s`` any frame without speech ends it (the next gap between
  words), and at ``max_utterance_s`` it is cut whatever the audio: an utterance's memory is bounded.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import numpy as np

VAD_RATES = (8000, 16000, 32000, 48000)


class VadError(ValueError):
    """Settings or audio the detector cannot take."""


@dataclass(frozen=True)
class VadSettings:
    """How audio is cut into utterances (see the module docstring)."""

    aggressiveness: int = 2  # webrtcvad's mode, 0 (most speech) to 3 (least)
    frame_ms: int = 30
    pre_roll_s: float = 0.5
    start_frames: int = 3
    start_window: int = 5
    end_silence_s: float = 0.5
    soft_max_s: float = 20.0
    max_utterance_s: float = 30.0

    def check(self) -> None:
        """ValueError naming the setting that is out of range; every duration must be finite (an infinite
        longest utterance would be no bound, and its sample count overflows)."""
        for name in ("pre_roll_s", "end_silence_s", "soft_max_s", "max_utterance_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise VadError(f"vad {name} {value}: must be a finite number of seconds above 0")
        if self.aggressiveness not in (0, 1, 2, 3):
            raise VadError(f"vad aggressiveness {self.aggressiveness}: must be 0, 1, 2 or 3")
        if self.frame_ms not in (10, 20, 30):
            raise VadError(f"vad frame_ms {self.frame_ms}: must be 10, 20 or 30")
        if not 0 < self.end_silence_s <= 10:
            raise VadError(f"end of utterance silence {self.end_silence_s} s: must be in (0, 10]")
        if not 1 <= self.start_frames <= self.start_window:
            raise VadError("vad start_frames must be between 1 and start_window")
        if not 0 < self.soft_max_s <= self.max_utterance_s:
            raise VadError(
                f"longest utterance {self.max_utterance_s} s: must be positive and at least soft_max_s "
                f"{self.soft_max_s}"
            )


def voice_detector(sample_rate: int, aggressiveness: int):
    """A ``webrtcvad.Vad`` for ``sample_rate``; VadError when WebRTC's detector cannot run at that rate."""
    if sample_rate not in VAD_RATES:
        raise VadError(
            f"voice activity detection runs at {', '.join(map(str, VAD_RATES))} Hz, not at the model's "
            f"{sample_rate} Hz"
        )
    import webrtcvad

    return webrtcvad.Vad(aggressiveness)


@dataclass(frozen=True)
class Start:
    """An utterance starts at sample ``at`` (counted from the first sample fed)."""

    at: int


@dataclass(frozen=True)
class Audio:
    """Samples of the current utterance, in order."""

    samples: np.ndarray


@dataclass(frozen=True)
class End:
    """The current utterance ends at sample ``at``; speech was detected from ``speech_start`` to
    ``speech_end`` (samples; frame edges). ``cut``: ended by the length limit, not at a pause (the next
    utterance continues the sentence)."""

    at: int
    speech_start: int
    speech_end: int
    cut: bool = False


class Segmenter:
    """Feed int16 samples; get ``Start``/``Audio``/``End`` events (see the module docstring)."""

    def __init__(self, sample_rate: int, settings: VadSettings = VadSettings()):
        settings.check()
        self.settings = settings
        self.vad = voice_detector(sample_rate, settings.aggressiveness)
        self.sample_rate = sample_rate
        self.frame = sample_rate * settings.frame_ms // 1000
        self._leftover = np.zeros(0, np.int16)
        self._position = 0  # samples consumed in whole frames
        self._kept: collections.deque = collections.deque(
            maxlen=max(1, round(settings.pre_roll_s * 1000 / settings.frame_ms))
        )
        self._recent: collections.deque = collections.deque(maxlen=settings.start_window)
        self._in_utterance = False
        self._start = self._length = self._silence = 0
        self._speech_start = self._speech_end = 0
        self._end_frames = max(1, round(settings.end_silence_s * 1000 / settings.frame_ms))
        self._soft_max = round(settings.soft_max_s * sample_rate)
        self._max = round(settings.max_utterance_s * sample_rate)

    @property
    def in_utterance(self) -> bool:
        """Whether an utterance has started and not ended."""
        return self._in_utterance

    def feed(self, samples: np.ndarray) -> list:
        """Events for these samples (whole frames; the rest waits for the next call or ``finish``)."""
        samples = np.concatenate([self._leftover, np.asarray(samples, np.int16).reshape(-1)])
        whole = len(samples) - len(samples) % self.frame
        self._leftover = samples[whole:]
        events: list = []
        for offset in range(0, whole, self.frame):
            self._frame(samples[offset : offset + self.frame], events)
        return _merged(events)

    def finish(self) -> list:
        """End of the audio: the samples left over and the end of an utterance in progress."""
        events: list = []
        if self._in_utterance:
            if len(self._leftover):
                events.append(Audio(self._leftover))
                self._position += len(self._leftover)
            events.append(End(self._position, self._speech_start, self._speech_end))
            self._in_utterance = False
        self._leftover = np.zeros(0, np.int16)
        return _merged(events)

    def _frame(self, frame: np.ndarray, events: list) -> None:
        speech = self.vad.is_speech(frame.tobytes(), self.sample_rate)
        start, self._position = self._position, self._position + len(frame)
        if not self._in_utterance:
            self._kept.append((start, frame, speech))
            self._recent.append(speech)
            if sum(self._recent) >= self.settings.start_frames:
                self._begin(events)
            return
        events.append(Audio(frame))
        self._length += len(frame)
        if speech:
            self._silence = 0
            self._speech_end = self._position
        else:
            self._silence += 1
        paused = self._silence >= self._end_frames
        if paused or (self._silence and self._length >= self._soft_max) or self._length >= self._max:
            events.append(End(self._position, self._speech_start, self._speech_end, cut=not paused))
            self._in_utterance = False
            self._recent.clear()

    def _begin(self, events: list) -> None:
        kept = list(self._kept)
        self._kept.clear()
        self._in_utterance = True
        self._start = kept[0][0]
        self._length = sum(len(frame) for _, frame, _ in kept)
        self._silence = 0
        voiced = [(at, len(frame)) for at, frame, speech in kept if speech]
        self._speech_start = voiced[0][0]
        self._speech_end = voiced[-1][0] + voiced[-1][1]
        events.append(Start(self._start))
        events.append(Audio(np.concatenate([frame for _, frame, _ in kept])))


class Cutter:
    """No detector: the audio is one utterance from its first sample, cut every ``max_samples`` (each cut
    an ``End`` with ``cut=True``, the next utterance starting at once), so that an utterance's memory is
    bounded as with ``Segmenter``, whose ``feed``/``finish`` it shares."""

    def __init__(self, max_samples: int):
        if max_samples < 1:
            raise VadError(f"longest utterance of {max_samples} samples: must be at least 1")
        self.max_samples = int(max_samples)
        self._position = 0
        self._length = 0  # samples of the utterance in progress
        self._in_utterance = False

    @property
    def in_utterance(self) -> bool:
        """Whether an utterance has started and not ended."""
        return self._in_utterance

    def feed(self, samples: np.ndarray) -> list:
        """Events for these samples: ``Start``, ``Audio`` and, at each ``max_samples``, ``End``."""
        samples = np.asarray(samples, np.int16).reshape(-1)
        events: list = []
        while len(samples):
            if not self._in_utterance:
                events.append(Start(self._position))
                self._in_utterance, self._length = True, 0
            take = min(len(samples), self.max_samples - self._length)
            events.append(Audio(samples[:take]))
            samples = samples[take:]
            self._position += take
            self._length += take
            if self._length == self.max_samples:
                start = self._position - self._length
                events.append(End(self._position, start, self._position, cut=True))
                self._in_utterance = False
        return events

    def finish(self) -> list:
        """End of the audio: the end of the utterance in progress."""
        if not self._in_utterance:
            return []
        self._in_utterance = False
        return [End(self._position, self._position - self._length, self._position)]


def _merged(events: list) -> list:
    """Consecutive ``Audio`` events joined into one (fewer, larger feeds)."""
    out: list = []
    run: list[np.ndarray] = []
    for event in events:
        if isinstance(event, Audio):
            run.append(event.samples)
            continue
        if run:
            out.append(Audio(np.concatenate(run)))
            run = []
        out.append(event)
    if run:
        out.append(Audio(np.concatenate(run)))
    return out
