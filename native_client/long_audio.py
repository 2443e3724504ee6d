"""Long recordings: the client's ``--vad`` and ``--format text|json|srt|vtt``.

With ``--vad`` (implied by the subtitle formats) a file is read block by block through the voice
activity detector (``native_client.vad``; ``native_client.utterances``, the loop the server uses too):
silence is skipped, each utterance is transcribed on its own (a fresh ``Utterance``, the model's state
from zero) and forgotten but for its words, so memory is bounded by the longest utterance
(``max_utterance_s``), whatever the file's length. The utterances' words are joined into one transcript
with times from the start of the file; an utterance the length limit cut (not a pause) continues in the
next one, and a subtitle cue may span the cut.

Without ``--vad`` a file is one stream, as it always was, so today's transcripts do not change.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from native_client.subtitles import Utterance as Spoken
from native_client.subtitles import cues, to_srt, to_vtt
from native_client.transcripts import Candidate
from native_client.utterances import UtteranceLoop, run_steps
from native_client.vad import End, Segmenter, VadSettings

FORMATS = ("text", "json", "srt", "vtt")


def add_arguments(parser) -> None:
    """The client's options for long audio (``--vad``, ``--format``)."""
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="output: text (default), json (as --json), srt or vtt subtitles (these imply --vad)",
    )
    parser.add_argument(
        "--vad",
        action="store_true",
        help="skip silence and transcribe each utterance on its own (WebRTC's voice activity detector): "
        "long recordings in bounded memory; without it a file is one utterance, as before",
    )


@dataclass
class SegmentedTranscript:
    """A file transcribed utterance by utterance: the ``Transcript`` of the joined words (its
    ``to_dict`` is the client's ``--json`` object, plus ``utterances``) and the utterances themselves."""

    transcript: object  # native_client.model.Transcript
    utterances: list[Spoken]

    def to_dict(self) -> dict:
        """The ``--json`` object with ``utterances`` (start, end, text of each)."""
        out = self.transcript.to_dict()
        out["utterances"] = [
            {"start": round(u.start, 3), "end": round(u.end, 3), "text": u.candidate.text}
            for u in self.utterances
        ]
        return out

    @property
    def text(self) -> str:
        """The joined transcript."""
        return self.transcript.text

    @property
    def audio(self) -> str:
        """The file's path."""
        return self.transcript.audio

    @property
    def candidates(self) -> tuple:
        """The one candidate: the utterances' best ones joined."""
        return self.transcript.candidates


class SegmentJoiner:
    """Utterances transcribed one by one (the best candidate of each), joined into one transcript with
    times from the start of the audio; the client's ``--vad`` and the server's long ``POST /stt``."""

    def __init__(self, sample_rate: int):
        self.rate = sample_rate
        self.spoken: list[Spoken] = []

    def add(self, start: int, end: End, best: Candidate) -> None:
        """The utterance that started at sample ``start`` and ended with ``end``; ``best``: its candidate
        (word times from the utterance's start)."""
        offset = start / self.rate
        words = tuple(dataclasses.replace(w, start_time=w.start_time + offset) for w in best.words)
        self.spoken.append(
            Spoken(
                start=end.speech_start / self.rate,
                end=end.speech_end / self.rate,
                candidate=dataclasses.replace(best, words=words),
                cut=end.cut,
            )
        )

    def result(self, audio: str, samples: int, processing_s: float) -> SegmentedTranscript:
        """The joined transcript of ``audio`` (``samples`` long)."""
        from native_client.model import Transcript

        spoken = self.spoken
        candidate = Candidate(
            " ".join(u.candidate.text for u in spoken if u.candidate.text),
            sum(u.candidate.confidence for u in spoken),
            tuple(w for u in spoken for w in u.candidate.words),
        )
        transcript = Transcript(
            audio=audio,
            text=candidate.text,
            duration_s=samples / self.rate,
            processing_s=processing_s,
            candidates=(candidate,),
        )
        return SegmentedTranscript(transcript, spoken)


def transcribe_segmented(
    model,
    path: str | Path,
    convert_rate: bool = False,
    on_resample=None,
    settings: VadSettings = VadSettings(),
) -> SegmentedTranscript:
    """Transcribe ``path`` utterance by utterance (see the module docstring)."""
    from native_client.audio import stream_for_model

    started = time.perf_counter()
    rate = model.sample_rate
    loop = UtteranceLoop(model.runner, Segmenter(rate, settings))
    seconds = model.metadata.seconds_per_label
    joiner = SegmentJoiner(rate)
    samples = 0

    def add(steps) -> None:
        for ended in run_steps(steps, model.runner):
            joiner.add(ended.start, ended.end, model.decoder.candidates(ended.logits, 1, seconds)[0])

    for block in stream_for_model(path, rate, convert_rate, on_resample=on_resample):
        samples += len(block)
        add(loop.feed(block))
    add(loop.feed(np.zeros(0, np.int16), final=True))
    return joiner.result(str(path), samples, time.perf_counter() - started)


def render(result, output: str) -> str:
    """A ``SegmentedTranscript`` as ``srt`` or ``vtt`` subtitles."""
    found = cues(result.utterances)
    return to_srt(found) if output == "srt" else to_vtt(found)
