"""The voice-activity loop: a detector's events (``native_client.vad``) turned into ``Utterance``s.

One loop for every caller that cuts audio into utterances: the client's ``--vad`` (``long_audio``), the
server's WebSocket sessions and its long ``POST /stt``. ``UtteranceLoop.feed`` is a generator of steps,
so that a caller may run the model however it runs it, synchronously or awaiting the server's engine
between two steps:

- an ``Utterance``: run its ready chunks and ``accept`` their logits before asking for the next step
  (``native_client.stream.run_ready`` on one runner; the server's ``BatchEngine``);
- an ``Ended``: an utterance that ended, with its logits; decode it.

``run_steps`` is the synchronous driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from native_client.runtime import StepRunner
from native_client.stream import Utterance, run_ready
from native_client.vad import Audio, Cutter, End, Segmenter, Start, VadSettings


@dataclass
class Ended:
    """An utterance that ended: the sample it started at (counted from the first one fed), the detector's
    ``End`` (where its speech was, whether a length limit cut it) and its logits ``[time, n_classes]``."""

    start: int
    end: End
    logits: np.ndarray


def detector(sample_rate: int, vad: VadSettings | None, max_samples: int):
    """WebRTC's voice activity detector with ``vad``'s settings, or without one (None) all the audio as one
    utterance cut every ``max_samples``: either way an utterance's memory is bounded."""
    return Segmenter(sample_rate, vad) if vad is not None else Cutter(max_samples)


class UtteranceLoop:
    """Audio through a detector (``Segmenter`` or ``Cutter``) into one ``Utterance`` at a time, each
    started afresh (the model's state from zero) on ``runner``'s export (see the module docstring)."""

    def __init__(self, runner: StepRunner, segmenter):
        self.runner = runner
        self.segmenter = segmenter
        self.utterance: Utterance | None = None  # the one in progress
        self.start = 0  # where it started

    def feed(self, samples: np.ndarray, final: bool = False) -> Iterator[Utterance | Ended]:
        """The steps for these int16 samples (``final``: the end of the audio, an utterance in progress
        ends). An incremental utterance in progress is handed out to run once the samples are in it."""
        events = self.segmenter.feed(samples)
        if final:
            events += self.segmenter.finish()
        for event in events:
            if isinstance(event, Start):
                self.utterance, self.start = Utterance(self.runner), event.at
            elif isinstance(event, Audio) and self.utterance is not None:
                self.utterance.feed_audio(event.samples)
            elif isinstance(event, End) and self.utterance is not None:
                utterance, self.utterance = self.utterance, None
                utterance.finish()
                yield utterance
                yield Ended(self.start, event, utterance.logits())
        if self.utterance is not None and self.utterance.incremental and self.utterance.has_ready:
            yield self.utterance


def run_steps(steps: Iterator[Utterance | Ended], runner: StepRunner) -> Iterator[Ended]:
    """Run ``steps`` (``UtteranceLoop.feed``'s) on ``runner`` as they come; the utterances that ended."""
    for step in steps:
        if isinstance(step, Utterance):
            run_ready(runner, step)
        else:
            yield step
