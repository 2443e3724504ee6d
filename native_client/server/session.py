"""One recognition connection, in vosk-server's protocol, apart from the WebSocket library.

A client sends an optional ``{"config": {"sample_rate": 16000, "words": true, "max_alternatives": 0}}``,
then binary frames of 16-bit little-endian mono PCM, then ``{"eof" : 1}``. Each binary frame is answered
with one message, as vosk-server does (its clients wait for it before sending the next): ``{"partial":
"..."}``, or, when an utterance ended in that frame (the voice activity detector found a pause), its
result ``{"result": [{"word", "start", "end", "conf"}, ...], "text": "..."}``. ``eof`` is answered with
the last result, after which the server closes the connection. Anything else is refused with ``{"error":
"..."}`` and the connection closed (``ProtocolError``).
"""

from __future__ import annotations

import json
import math

import numpy as np
import soxr

from native_client.audio import RESAMPLE_QUALITY, to_int16
from native_client.server.budget import TokenBucket
from native_client.server.engine import RealTimeClock
from native_client.stream import Utterance
from native_client.transducer_decoder import GreedyPartials
from native_client.utterances import Ended, UtteranceLoop, detector

CONFIG_KEYS = ("sample_rate", "words", "max_alternatives")
MAX_ALTERNATIVES = 10
SAMPLE_RATES = (4000, 192000)  # the rates a client may stream at (resampled to the model's)


class ProtocolError(ValueError):
    """A message the server refuses: sent to the client as ``{"error": str(error)}``, then it closes."""


class RecognizerSession:
    """The state of one connection: its settings, its resampler, its voice activity detector and the
    utterance in progress. ``service`` (``native_client.server.app.Service``) holds the model, the engine
    and the settings shared by all connections."""

    def __init__(self, service):
        self.service = service
        self.model_rate = service.model.sample_rate
        self.sample_rate = self.model_rate
        self.words = True
        self.alternatives = 0
        self.configured = False
        self.audio_started = False
        self._resampler = None
        limits = service.limits
        self._audio_budget = TokenBucket(limits.max_audio_rate, burst=limits.max_message_seconds)
        self._clock = RealTimeClock()  # when this stream's audio is due: the engine serves real time first
        # The detector, or without one (--no-vad) the whole connection as one utterance cut at the longest
        # utterance: either way an utterance's memory (and a normalised export's reruns) is bounded.
        segmenter = detector(self.model_rate, service.vad, round(service.max_utterance_s * self.model_rate))
        self._utterances = UtteranceLoop(service.model.runner, segmenter)
        self._partial_of: Utterance | None = None  # the utterance _partial and _rerun_at are of
        # greedy partials of the utterance in progress (a transducer's search fed the new frames only)
        self._partials = GreedyPartials(service.model.greedy)
        self._partial = ""
        self._rerun_at = 0  # normalised exports: samples of the utterance at the last partial rerun

    # ---- text messages

    def text_message(self, text: str) -> str:
        """``config`` (returns ``"config"``, nothing is sent back) or ``eof`` (returns ``"eof"``)."""
        try:
            message = json.loads(text)
        except ValueError:
            raise ProtocolError(f"text frame is not JSON: {text[:60]!r}") from None
        except RecursionError:  # '[' * 100000: Python's parser recurses once per level
            raise ProtocolError(f"text frame nests too deeply: {text[:60]!r}") from None
        if not isinstance(message, dict) or len(message) != 1:
            raise ProtocolError(f'expected {{"config": {{...}}}} or {{"eof": 1}}, got {text[:60]!r}')
        ((key, value),) = message.items()
        if key == "eof":
            return "eof"
        if key == "config":
            self.configure(value)
            return "config"
        raise ProtocolError(f'unknown message {key!r}: expected "config" or "eof"')

    def configure(self, config) -> None:
        """Apply a ``config`` object; only before the first audio."""
        if self.audio_started:
            raise ProtocolError("config after audio: send it first")
        if not isinstance(config, dict):
            raise ProtocolError(f"config: expected an object, got {json.dumps(config)[:60]}")
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise ProtocolError(
                f"config: {', '.join(unknown)}: not supported (known: {', '.join(CONFIG_KEYS)})"
            )
        if "sample_rate" in config:
            rate = config["sample_rate"]
            low, high = SAMPLE_RATES
            if (
                isinstance(rate, bool)
                or not isinstance(rate, (int, float))
                or not math.isfinite(rate)
                or rate != int(rate)
                or not low <= rate <= high
            ):
                raise ProtocolError(
                    f"config.sample_rate {json.dumps(rate)}: expected a whole number of Hz from {low} to "
                    f"{high} (the model's is {self.model_rate}; others are resampled)"
                )
            self.sample_rate = int(rate)
        if "words" in config:
            if not isinstance(config["words"], (bool, int)):
                raise ProtocolError("config.words: expected true or false")
            self.words = bool(config["words"])
        if "max_alternatives" in config:
            count = config["max_alternatives"]
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_ALTERNATIVES:
                raise ProtocolError(f"config.max_alternatives: expected 0 to {MAX_ALTERNATIVES}")
            self.alternatives = count
        self.configured = True

    # ---- audio

    def samples_of(self, data: bytes) -> np.ndarray:
        """int16 samples at the model's rate of a binary frame (resampled from the client's rate), within
        the connection's audio budget (``Limits.max_audio_rate``, ``max_message_seconds``): a frame's
        cost is its length at the client's rate, which a low rate turns into many seconds of work."""
        if len(data) % 2:
            raise ProtocolError(f"binary frame of {len(data)} bytes: 16-bit samples take 2 bytes each")
        seconds = len(data) / 2 / self.sample_rate
        limits = self.service.limits
        if seconds > limits.max_message_seconds:
            raise ProtocolError(
                f"binary frame of {seconds:.1f} s of audio at {self.sample_rate} Hz: at most "
                f"{limits.max_message_seconds:g} s a message"
            )
        if not self._audio_budget.take(seconds):
            raise ProtocolError(
                f"audio faster than {limits.max_audio_rate:g} times real time (--max-audio-rate): send it "
                "no faster than it plays, or a few times that"
            )
        samples = np.frombuffer(data, "<i2")
        self.audio_started = True
        if self.sample_rate == self.model_rate:
            return samples.astype(np.int16)
        if self._resampler is None:
            self._resampler = soxr.ResampleStream(
                self.sample_rate, self.model_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY
            )
        return to_int16(self._resampler.resample_chunk(samples.astype(np.float32) / 32768))

    async def audio(self, data: bytes) -> dict:
        """The reply to one binary frame: the result of utterances that ended in it, else a partial."""
        count, steps, step, text = await self.service.off_loop(self._first_step, self.samples_of, data, False)
        due = self._clock.advance(count / self.model_rate)
        ended, text = await self._run(steps, step, text, due)
        if ended:
            return await self._result(ended)
        return {"partial": text if text is not None else await self._rerun_partial(due)}

    async def eof(self) -> dict:
        """The reply to ``eof``: the last utterance's result (``{"text": ""}`` when there was none)."""
        count, steps, step, _ = await self.service.off_loop(
            self._first_step, self._flush_resampler, None, True
        )
        ended, _ = await self._run(steps, step, None, self._clock.advance(count / self.model_rate))
        return await self._result(ended)

    def _flush_resampler(self, _=None) -> np.ndarray:
        """The resampler's last samples (none without one)."""
        if self._resampler is None:
            return np.zeros(0, np.int16)
        return to_int16(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))

    # Each trip to the audio threads costs a wake-up of a thread and of the event loop, so a message takes
    # two: its samples and first step, then (after the model) its next step with the greedy partial.
    def _first_step(self, samples_of, data, final: bool) -> tuple:
        """On an audio thread: the samples of ``data`` (``samples_of``) into the detector and utterances;
        (their count, the steps, the first step or None, the partial when there is no step)."""
        samples = samples_of(data)
        steps = self._utterances.feed(samples, final)
        step = next(steps, None)
        return len(samples), steps, step, self._greedy_partial() if step is None and not final else None

    def _next_step(self, steps, partial: bool) -> tuple:
        """On an audio thread: (the next step or None, and when there is none and ``partial``, the greedy
        partial)."""
        step = next(steps, None)
        return step, self._greedy_partial() if step is None and partial else None

    def _greedy_partial(self) -> str | None:
        """The partial of an incremental utterance (``""`` between utterances); None for a normalised
        export's, which reruns the utterance through the engine (``_rerun_partial``)."""
        utterance = self._utterances.utterance
        if utterance is None:
            self._partials.forget()  # the last utterance's frames go with it
            return ""
        return self._partials.text(utterance) if utterance.incremental else None

    async def _run(self, steps, step, text: str | None, due: float) -> tuple[list[Ended], str | None]:
        """Run the steps from ``step`` (their chunks due at ``due``) through the engine; (the utterances
        that ended, the greedy partial when none did and it could be made on the way)."""
        ended = []
        while step is not None:
            if isinstance(step, Utterance):
                logits, state = await self.service.engine.run(step.ready(), step.state, due)
                step.accept(logits, state)
            else:
                ended.append(step)
            step, text = await self.service.off_loop(self._next_step, steps, not ended)
        return ended, text

    async def _rerun_partial(self, due: float) -> str:
        """The partial of a normalised export's utterance in progress (``_greedy_partial`` makes every other
        one): the utterance is rerun from its start at most every ``partial_interval_s`` of audio (due when
        the message's audio is), and the last rerun's text stands in between."""
        utterance, greedy = self._utterances.utterance, self.service.model.greedy
        if utterance is not self._partial_of:
            self._partial_of, self._partial, self._rerun_at = utterance, "", 0
        if utterance.samples - self._rerun_at >= self.service.partial_interval_s * self.model_rate:
            self._rerun_at = utterance.samples
            chunks = await self.service.off_loop(utterance.rerun)
            logits, _ = await self.service.engine.run(chunks, utterance.zero_state, due)
            self._partial = await self.service.off_loop(greedy.decode, logits)
        return self._partial

    async def _result(self, ended: list[Ended]) -> dict:
        """vosk-server's result object of the utterances that ended (normally one; several ended in one
        frame are joined into one result)."""
        model = self.service.model
        seconds = model.metadata.seconds_per_label
        count = max(1, self.alternatives)
        found = []
        for utterance in ended:
            candidates = await self.service.engine.candidates(utterance.logits, count, seconds)
            found.append((utterance.start / self.model_rate, candidates))
        if self.alternatives:
            if len(found) == 1:
                offset, candidates = found[0]
                return {"alternatives": [self._alternative(c, offset) for c in candidates]}
            return {"alternatives": [self._joined(found)]}
        joined = self._joined(found)
        joined.pop("confidence")
        return joined

    def _words(self, candidate, offset: float) -> list[dict]:
        return [
            {
                "conf": round(w.confidence, 4) if w.confidence is not None else 1.0,
                "end": round(offset + w.start_time + w.duration, 3),
                "start": round(offset + w.start_time, 3),
                "word": w.word,
            }
            for w in candidate.words
        ]

    def _alternative(self, candidate, offset: float) -> dict:
        out = {"confidence": round(candidate.confidence, 4), "text": candidate.text}
        if self.words:
            out["result"] = self._words(candidate, offset)
        return out

    def _joined(self, found: list) -> dict:
        """The best candidates of several utterances as one result."""
        best = [(offset, candidates[0]) for offset, candidates in found if candidates]
        out = {}
        if self.words:
            out["result"] = [word for offset, c in best for word in self._words(c, offset)]
        out["text"] = " ".join(c.text for _, c in best if c.text)
        out["confidence"] = round(sum(c.confidence for _, c in best), 4)
        return out
