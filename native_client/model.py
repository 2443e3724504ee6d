"""A loaded export: one-shot transcription and streams."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from native_client.audio import stream_for_model
from native_client.decoders.greedy import GreedyDecoder
from native_client.deepspeech_tflite import DeepSpeechTFLiteRunner, is_deepspeech_tflite
from native_client.metadata import ExportError, ExportMetadata, load_metadata, verify_manifest
from native_client.runtime import StepRunner, make_runner
from native_client.stream import Stream, run_frames
from native_client.transducer_decoder import TransducerDecoder, transducer_decoders


@dataclass
class Transcript:
    """The result of transcribing one file."""

    audio: str
    text: str
    duration_s: float
    processing_s: float
    candidates: tuple = ()  # Candidate transcripts (text, confidence, word timings), best first

    @property
    def rtf(self) -> float | None:
        """Real-time factor: processing time over audio duration; None for no audio (JSON has no NaN)."""
        return self.processing_s / self.duration_s if self.duration_s else None

    def to_dict(self) -> dict:
        """The JSON form the CLI prints: audio, text, duration_s, processing_s, rtf, and ``transcripts``
        (confidence and word timings of each candidate, DeepSpeech's ``--json``)."""
        return {
            "audio": self.audio,
            "text": self.text,
            "duration_s": self.duration_s,
            "processing_s": self.processing_s,
            "rtf": None if self.rtf is None else round(self.rtf, 4),
            "transcripts": [c.to_dict() for c in self.candidates],
        }


class Model:
    """An exported acoustic model with its decoder.

    ``export_dir`` is an export directory, or a DeepSpeech/Coqui ``.tflite`` file
    (``native_client.deepspeech_tflite``). ``backend`` is ``tflite`` (default), ``saved_model`` or
    ``frozen_graph``; ``decoder`` is a ``native_client.decoders.Decoder`` (default: greedy;
    ``decoder_for_export`` builds the one the export's metadata describes; a transducer's are its own,
    ``greedy`` and ``beam_search``, ``native_client.transducer_decoder``). ``plugins``: dotted names of
    implementations of one's own (a front end) the export may load; built-in ones need none.
    """

    def __init__(
        self,
        export_dir: str | Path,
        backend: str = "tflite",
        threads: int = 1,
        decoder=None,
        plugins: tuple[str, ...] = (),
    ):
        if is_deepspeech_tflite(export_dir):
            if backend != "tflite":
                raise ExportError(f"{export_dir}: a DeepSpeech/Coqui .tflite runs on the tflite backend")
            self.runner: StepRunner = DeepSpeechTFLiteRunner(export_dir, threads)
            self.metadata: ExportMetadata = self.runner.metadata
        else:
            self.metadata = load_metadata(export_dir, plugins)
            verify_manifest(
                self.metadata.directory,
                [self.metadata.files[backend]] if backend in self.metadata.files else None,
            )
            self.runner = make_runner(self.metadata, backend, threads)
        self.greedy = GreedyDecoder(self.metadata.alphabet)
        # A transducer's modified beam search (its export's beam); None for a CTC model.
        self.beam_search: TransducerDecoder | None = None
        if self.metadata.transducer is not None:
            self.greedy, self.beam_search = transducer_decoders(
                self.metadata.transducer, self.runner.signature_caller(), self.metadata.alphabet
            )
        self.decoder = decoder or self.greedy
        self._check_decoder(self.decoder)
        self.decoder_spec = None  # the DecoderSpec the decoder was built from, when known (model_options)

    def _check_decoder(self, decoder) -> None:
        """ExportError for a CTC decoder over a transducer's projected frames (its text would be noise)."""
        if self.metadata.transducer is not None and not isinstance(decoder, TransducerDecoder):
            raise ExportError(
                f"{self.metadata.directory}: a transducer export decodes with its own searches "
                f"(Model.greedy, Model.beam_search), not with the {getattr(decoder, 'name', decoder)} decoder"
            )

    @property
    def sample_rate(self) -> int:
        """The sample rate the model was trained on."""
        return self.metadata.features.sample_rate

    def create_stream(self, intermediate_decoder=None, whole_utterance: bool = False) -> Stream:
        """A new stream; intermediate transcripts use ``intermediate_decoder`` (default: greedy, cheap).
        ExportError for a model without a streaming form, unless ``whole_utterance`` (the caller asks for
        the transcript at the end only: the model then runs once over all the audio fed)."""
        if self.metadata.streaming is None and not whole_utterance:
            family = self.metadata.raw.get("architecture", "its family")
            raise ExportError(
                f"{self.metadata.directory}: this model ({family}) has no streaming form; transcribe whole "
                f"utterances (--audio, Model.transcribe_file)"
            )
        return Stream(self.runner, self.decoder, intermediate_decoder or self.greedy)

    def logits(self, samples: np.ndarray) -> np.ndarray:
        """Logits ``[time, n_classes]`` of a whole utterance of int16 samples (a transducer's projected
        encoder frames, ``[time, joint_dim]``)."""
        frames = self.metadata.features.frames(np.asarray(samples).reshape(-1))
        logits, _ = run_frames(self.runner, frames)
        return logits

    def transcribe(self, samples: np.ndarray) -> str:
        """Transcript of a whole utterance of int16 mono samples at ``sample_rate``."""
        return self.decoder.decode(self.logits(samples))

    def transcribe_file(
        self, path: str | Path, convert_rate: bool = False, candidates: int = 1, on_resample=None
    ) -> Transcript:
        """Read, check and transcribe one audio file; ``convert_rate`` resamples another rate (and calls
        ``on_resample(rate)`` first). ``candidates``: how many transcripts to keep (beam search), each
        with its confidence and word timings.

        The file is read in blocks and fed through a stream (features and model windows computed block
        by block), so memory stays bounded for long recordings; the transcript equals ``transcribe``'s.
        ``processing_s`` includes reading the file."""
        started = time.perf_counter()
        stream = self.create_stream(whole_utterance=True)
        for block in stream_for_model(path, self.sample_rate, convert_rate, on_resample=on_resample):
            stream.feed_audio(block)
        stream.flush()
        found = stream.candidates(candidates, self.metadata.seconds_per_label)
        return Transcript(
            audio=str(path),
            text=found[0].text,
            duration_s=stream.samples / self.sample_rate,
            processing_s=time.perf_counter() - started,
            candidates=tuple(found),
        )


def open_model(
    export_dir: str | Path,
    backend: str = "tflite",
    threads: int = 1,
    decoder_factory=None,
    plugins: tuple[str, ...] = (),
) -> Model:
    """Load an export (or a DeepSpeech/Coqui ``.tflite``); ``decoder_factory(metadata)`` may build a decoder
    (e.g. ``native_client.export_decoder.decoder_for_export``: the export's own, beam search with its LM;
    for a transducer, whose factory gives None, its modified beam search);
    ``plugins`` as for ``Model``."""
    model = Model(export_dir, backend, threads, plugins=plugins)
    if decoder_factory is not None:
        decoder: object | None = decoder_factory(model.metadata)
        if decoder is not None:
            model._check_decoder(decoder)
            model.decoder = decoder
        elif model.beam_search is not None:  # a transducer: its export's own search, no LM
            model.decoder = model.beam_search
    return model
