"""Long recordings, each with the whole of its text in a same-name ``.txt`` beside it (an audiobook's
chapters and their book text, lectures, sessions with their transcripts): ``chapter01.flac`` +
``chapter01.txt``, in any sub-folders, as the ``folder`` importer reads them (parts, speakers, audio
formats, missing and non-UTF-8 texts alike).

The text keeps its lines: the Align stage (``pipeline.stages.align``) cuts each recording into utterances
at its sentence ends and line breaks, with the aligner model its ``align`` options name, instead of an
Import. A recording's speaker is the first folder under its part, else the recording itself, so that
a recording goes to one split whole: train, dev or test, never two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.data.importers.folder import AUDIO_SUFFIXES, Folder

# The score under which an aligned utterance is rejected as misaligned: the lowest mean log-probability of
# its path over any 0.6 s (pipeline.data.align); see docs/DATA.md "Long recordings" for how it was chosen.
DEFAULT_MIN_SCORE = -3.0


@dataclass(frozen=True)
class AlignOptions:
    """How the Align stage cuts a corpus's recordings (``data.corpora[].align``)."""

    model: str = ""  # the aligner: an export directory of this project, or a DeepSpeech/Coqui .tflite
    max_seconds: float = 20.0  # sentences longer (at a slow reading) are cut; neighbours joined up to it
    min_score: float = DEFAULT_MIN_SCORE  # utterances scoring under it are rejected as misaligned


@dataclass(frozen=True)
class RecordingsOptions:
    """Options of the recordings importer."""

    audio_suffixes: tuple[str, ...] = AUDIO_SUFFIXES  # which files are audio (lower-case suffixes)
    align: AlignOptions = field(default_factory=AlignOptions)


class Recordings(Folder):
    """Long recordings with their whole text beside them, cut into utterances by the Align stage."""

    name = "recordings"
    stage = "align"
    Options = RecordingsOptions

    def transcript(self, text: str) -> str:
        """The whole text, lines kept (a line break ends an utterance)."""
        return text


IMPORTER = Recordings()
