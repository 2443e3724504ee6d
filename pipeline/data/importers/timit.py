"""TIMIT (LDC93S1): ``<root>/{TRAIN,TEST}/<dialect region>/<speaker>/<sentence>.{WAV,TXT,WRD,PHN}``,
the ``.WAV`` files being NIST SPHERE (read as they are), names upper- or lower-case as the copy has
them; ``path`` is the folder holding ``TRAIN`` and ``TEST`` (or one holding ``TIMIT/`` or ``data/``
with them). Copies that also hold converted ``<sentence>.WAV.wav`` files are read from the originals.

Parts: ``train`` (TRAIN), ``test`` (all of TEST), and the two standard subsets of TEST:
``core_test`` (the 24-speaker core test set) and ``dev`` (the 50-speaker development set of Kaldi's
and lhotse's recipes). Official splits: train, dev, core_test, speaker-disjoint.

The transcript comes from ``.TXT`` (``<first sample> <last sample> <sentence>``; ``transcript:
wrd`` takes the words of ``.WRD`` instead). The two dialect sentences every speaker reads (``SA1``,
``SA2``) are left out (``dialect_sentence``), as is usual, unless ``include_sa: true``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.data.importers import (
    CorpusImporter,
    CorpusLayoutError,
    Dropped,
    Row,
    Utterance,
    bad_encoding,
    read_text,
    sorted_dirs,
    walk,
)

# Speaker sets of the TIMIT test directory (facts of the corpus, as every TIMIT recipe lists them).
CORE_TEST_SPEAKERS = frozenset(
    "fdhc0 felc0 fjlm0 fmgd0 fmld0 fnlp0 fpas0 fpkt0 mbpm0 mcmj0 mdab0 mgrt0 "
    "mjdh0 mjln0 mjmp0 mklt0 mlll0 mlnt0 mnjm0 mpam0 mtas1 mtls0 mwbt0 mwew0".split()
)
DEV_SPEAKERS = frozenset(
    "fadg0 faks0 fcal1 fcmh0 fdac1 fdms0 fdrw0 fedw0 fgjd0 fjem0 fjmg0 fjsj0 fkms0 fmah0 fmml0 fnmr0 "
    "frew0 fsem0 majc0 mbdg0 mbns0 mbwm0 mcsh0 mdlf0 mdls0 mdvc0 mers0 mgjf0 mglb0 mgwt0 mjar0 mjfc0 "
    "mjsw0 mmdb1 mmdm2 mmjr0 mmwh0 mpdf0 mrcs0 mreb0 mrjm4 mrjr0 mroa0 mrtk0 mrws1 mtaa0 mtdt0 mteb0 "
    "mthc0 mwjg0".split()
)
PARTS = {"train": ("train", None), "test": ("test", None), "dev": ("test", DEV_SPEAKERS)}
PARTS["core_test"] = ("test", CORE_TEST_SPEAKERS)


@dataclass(frozen=True)
class TimitOptions:
    """Options of the TIMIT importer."""

    transcript: str = "txt"  # txt: the sentence of .TXT; wrd: the words of .WRD
    include_sa: bool = False  # keep the dialect sentences SA1/SA2


class Timit(CorpusImporter):
    """The TIMIT layout (dialect region / speaker folders of SPHERE audio and text files)."""

    name = "timit"
    SELECTIONS = frozenset({"dialect_sentence"})
    Options = TimitOptions
    CHOICES = {"transcript": ("txt", "wrd")}

    def locate(self, path: Path) -> Path:
        """The folder holding TRAIN and TEST: ``path`` or its ``TIMIT``/``data`` sub-folder (any case)."""
        root = super().locate(path)
        for candidate in [root, *sorted_dirs(root)]:
            if candidate != root and candidate.name.lower() not in ("timit", "data"):
                continue
            names = {p.name.lower() for p in sorted_dirs(candidate)}
            if {"train", "test"} & names:
                return candidate
        raise CorpusLayoutError(
            f"{path}: no TRAIN or TEST folder (nor under TIMIT/ or data/): not a TIMIT copy"
        )

    def _folder(self, root: Path, name: str) -> Path | None:
        return next((p for p in sorted_dirs(root) if p.name.lower() == name), None)

    def parts(self, root: Path, options) -> list[str]:
        """train, test, dev and core_test, those whose folder exists."""
        return [part for part, (folder, _) in PARTS.items() if self._folder(root, folder) is not None]

    def default_splits(self, root: Path, options) -> dict[str, list[str]]:
        """train: TRAIN; dev: the 50 development speakers; test: the 24 core test speakers."""
        found = self.parts(root, options)
        return {
            s: [p] if p in found else []
            for s, p in (("train", "train"), ("dev", "dev"), ("test", "core_test"))
        }

    def listing(self, root: Path, parts: list[str], options) -> Iterator[os.DirEntry]:
        """Every file of the TRAIN/TEST folders the parts read."""
        for folder in sorted({PARTS[part][0] for part in parts}):
            found = self._folder(root, folder)
            if found is not None:
                yield from walk(found, (".wav", ".txt", ".wrd"))

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """The sentences of ``part``, region by region, speaker by speaker, sentence by sentence."""
        folder_name, speakers = PARTS[part]
        folder = self._folder(root, folder_name)
        if folder is None:
            return
        for region in sorted_dirs(folder):
            for speaker in sorted_dirs(region):
                if speakers is not None and speaker.name.lower() not in speakers:
                    continue
                yield from self._speaker(speaker, options)

    def _speaker(self, folder: Path, options) -> Iterator[Row]:
        with os.scandir(folder) as entries:
            names = {entry.name.lower(): entry.name for entry in entries}
        speaker = folder.name.lower()
        for lower in sorted(names):
            if not lower.endswith(".txt"):
                continue
            stem = lower[: -len(".txt")]
            text_file = folder / names[lower]
            audio = folder / names.get(stem + ".wav", stem.upper() + ".WAV")
            if stem.startswith("sa") and not options.include_sa:
                yield Dropped(
                    str(text_file),
                    "dialect_sentence",
                    f"{stem.upper()} is a dialect sentence (include_sa: false)",
                )
                continue
            if options.transcript == "wrd":
                if stem + ".wrd" not in names:
                    yield Dropped(str(text_file), "missing_transcript", f"no {stem.upper()}.WRD beside it")
                    continue
                words_file = folder / names[stem + ".wrd"]
                content = read_text(words_file)
                if isinstance(content, UnicodeDecodeError):
                    yield bad_encoding(str(words_file), content, str(audio))
                    continue
                words = [line.split()[2] for line in content.splitlines() if len(line.split()) >= 3]
                yield Utterance(str(audio), " ".join(words), speaker, f"{words_file}:1")
                continue
            content = read_text(text_file)
            if isinstance(content, UnicodeDecodeError):
                yield bad_encoding(str(text_file), content, str(audio))
                continue
            fields = (content.splitlines() or [""])[0].split(None, 2)
            if len(fields) < 3:
                yield Dropped(
                    f"{text_file}:1", "malformed_row", "expected <first sample> <last sample> <sentence>"
                )
                continue
            yield Utterance(str(audio), fields[2], speaker, f"{text_file}:1")


IMPORTER = Timit()
