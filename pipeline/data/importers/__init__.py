"""Corpus importers: one module per corpus layout (``data.corpora[].importer``), each naming its
implementation ``IMPORTER``; ``importer(name)`` finds a built-in one by module name or a user's by
dotted module path (see ``native_client.plugins``).

An importer only *reads the layout*: it names the corpus's parts (``train-clean-100``,
``dev.tsv``'s ``dev``, ...), says which parts make the official train/dev/test splits (or that there
are none, and the import splits by speaker), lists the files whose names, sizes and modification
times fingerprint an import (a listing, never a read, so that ``complete()`` stays cheap), and
streams the utterances of one part: audio path, optional segment, raw transcript, speaker, and the
``file:line`` it came from, or a ``Dropped`` row with its reason. Text normalisation, the audio
header check, conversion of unreadable formats, split assignment and the manifests are done once
for every importer by ``pipeline.data.importing``.

To add an importer, write one module here (or anywhere, named by its dotted path) defining a
subclass of ``CorpusImporter`` and ``IMPORTER = ThatClass()``; helpers shared by importers live in
modules whose names start with ``_`` (those are not importers).
"""

from __future__ import annotations

import codecs
import dataclasses
import os
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from native_client.plugins import find_plugin


def importer(name: str, what: str = "data.corpora[].importer") -> CorpusImporter:
    """The importer named ``name`` (a module of this package, or a dotted module path)."""
    return find_plugin(__name__, name, "IMPORTER", what)


class CorpusLayoutError(ValueError):
    """The corpus cannot be imported at all (no such folder, a part that does not exist, a TSV without
    the columns it needs); the message names the path or ``file:line`` and what is wrong."""


@dataclass(frozen=True)
class Utterance:
    """One utterance as the corpus gives it.

    ``audio`` is the absolute path of the audio file; ``offset`` and ``duration`` (seconds; None =
    to the end) cut a segment from it, as lhotse's supervisions do. ``command`` (Kaldi's piped
    ``wav.scp`` only) is a shell command whose standard output is the audio, run once at import
    when the importer allows it, in the folder ``command_dir``; ``audio`` then names the recording
    for messages."""

    audio: str
    transcript: str
    speaker: str
    source: str
    offset: float = 0.0
    duration: float | None = None
    command: str = ""
    command_dir: str = ""


@dataclass(frozen=True)
class Dropped:
    """A row of the corpus that cannot become an utterance: ``reason`` is a short code for the report,
    ``detail`` says why, ``source`` is ``file:line`` (or the path it concerns)."""

    source: str
    reason: str
    detail: str
    audio: str = ""


Row = Utterance | Dropped


@dataclass(frozen=True)
class NoOptions:
    """An importer without options of its own."""


class CorpusImporter:
    """What every importer provides; subclasses override ``parts``, ``utterances`` and ``listing``,
    and ``default_splits`` when the corpus has official splits.

    ``Options`` is a frozen dataclass of the importer's own settings (the extra keys of its
    ``data.corpora`` entry), every field with a default; ``CHOICES`` maps a field to its allowed
    values; ``SELECTIONS`` names the drop reasons that leave rows out on purpose."""

    name: str = ""
    # The stage that turns the corpus into manifests: ``import``, or ``align`` for long recordings with
    # their whole text (``recordings``: the Align stage cuts them into utterances).
    stage: str = "import"
    Options: type = NoOptions
    CHOICES: typing.ClassVar[dict[str, tuple]] = {}
    # Drop reasons that are the corpus's own exclusions, made by design or by the importer's options
    # (Common Voice's held-out speakers, TIMIT's dialect sentences): rows left out on purpose, not
    # defects, so they never count towards ``data.max_reject_fraction``.
    SELECTIONS: typing.ClassVar[frozenset[str]] = frozenset()

    def options(self, mapping: Mapping[str, object] | None = None, where: str = "data.corpora[]") -> object:
        """The importer's options from a config mapping; ValueError naming ``where`` and the key for an
        unknown key, a wrong type or a value not among ``CHOICES``."""
        return parse_options(self.Options, mapping or {}, where, self.CHOICES)

    def locate(self, path: Path) -> Path:
        """The corpus root for a configured ``path`` (e.g. a folder that holds ``LibriSpeech/``).
        CorpusLayoutError when it is not a folder."""
        if not path.is_dir():
            raise CorpusLayoutError(f"{path}: no such corpus folder")
        return path

    def parts(self, root: Path, options) -> list[str]:
        """The names of the parts found under ``root``, usable in ``train``/``dev``/``test``."""
        raise NotImplementedError

    def default_splits(self, root: Path, options) -> dict[str, list[str]] | None:
        """The official split of each part found (``{"train": [...], "dev": [...], "test": [...]}``), or
        None when the corpus has none and its parts are split by speaker."""
        return None

    def listing(self, root: Path, parts: list[str], options) -> Iterator[Path | os.DirEntry]:
        """The files (and folders) whose relative names, sizes and modification times fingerprint an
        import of ``parts``: metadata files and audio files, found by listing folders only."""
        raise NotImplementedError

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """The utterances of ``part`` in a deterministic order, streamed (a part is never held whole)."""
        raise NotImplementedError


def walk(
    folder: Path, suffixes: tuple[str, ...] = (), _above: frozenset = frozenset()
) -> Iterator[os.DirEntry]:
    """The files under ``folder`` (recursively, unsorted, symbolic links followed), those whose
    lower-cased name ends with one of ``suffixes`` when given; for listings, where order does not matter.
    CorpusLayoutError naming the link when a symbolic link leads back to a folder above it (a loop)."""
    try:
        entries = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as error:
        raise CorpusLayoutError(f"{folder}: cannot list this folder: {error.strerror}") from None
    above = _above | {folder_identity(folder)}
    with entries:
        for entry in entries:
            if entry.is_dir():
                check_not_a_loop(Path(entry.path), above)
                yield from walk(Path(entry.path), suffixes, above)
            elif not suffixes or entry.name.lower().endswith(suffixes):
                yield entry


def folder_identity(folder: Path) -> tuple[int, int]:
    """(device, inode) of ``folder``, the same whichever symbolic link leads to it."""
    stat = os.stat(folder)
    return stat.st_dev, stat.st_ino


def check_not_a_loop(folder: Path, above: frozenset | set) -> None:
    """CorpusLayoutError naming ``folder`` when it is one of the folders ``above`` it (by
    ``folder_identity``): a symbolic link back up the tree, which a walk would follow for ever."""
    try:
        identity = folder_identity(folder)
    except OSError as error:
        raise CorpusLayoutError(f"{folder}: cannot open this folder: {error.strerror}") from None
    if identity in above:
        raise CorpusLayoutError(
            f"{folder}: a symbolic link loop (it leads back to {Path(folder).resolve()}, a folder above it); "
            "remove or replace the link"
        )


def text_lines(path: Path) -> Iterator[tuple[int, str | UnicodeDecodeError]]:
    """(line number, the line without its line end) for each line of the UTF-8 text file ``path`` (a
    byte-order mark before the first line is skipped); a line that is not UTF-8 comes as its
    UnicodeDecodeError, so that the caller drops that line (``bad_encoding``) and reads on."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                yield number, error


def bad_encoding(source: str, error: UnicodeDecodeError, audio: str = "") -> Dropped:
    """The ``bad_encoding`` drop of the text at ``source`` (``file`` or ``file:line``)."""
    return Dropped(
        source,
        "bad_encoding",
        f"{source}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at byte {error.start}); "
        "convert the file to UTF-8 (iconv -f <its encoding> -t utf-8)",
        audio,
    )


def read_text(path: Path) -> str | UnicodeDecodeError:
    """The whole UTF-8 text file ``path`` (a leading byte-order mark skipped), or its UnicodeDecodeError."""
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        return error


def sorted_dirs(folder: Path) -> list[Path]:
    """The sub-folders of ``folder`` by name (one folder's names in memory, for a deterministic order)."""
    try:
        with os.scandir(folder) as entries:
            return sorted(Path(e.path) for e in entries if e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def check_parts(importer_name: str, root: Path, wanted: list[str], found: list[str]) -> None:
    """CorpusLayoutError naming the parts of ``wanted`` that are not among ``found``."""
    missing = [part for part in wanted if part not in found]
    if missing:
        raise CorpusLayoutError(
            f"{root}: {importer_name} part(s) {', '.join(missing)} not found; "
            f"found: {', '.join(found) or 'none'}"
        )


def parse_options(
    options_type: type, mapping: Mapping[str, object], where: str, choices: Mapping[str, tuple]
):
    """An instance of the dataclass ``options_type`` from ``mapping``, checking names, types and choices."""
    fields = {field.name: field for field in dataclasses.fields(options_type)}
    hints = typing.get_type_hints(options_type)
    values = {}
    for key, value in mapping.items():
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise ValueError(f"{where}: unknown key {key!r} for this importer; its options: {known}")
        expected = hints[key]
        if expected is bool and not isinstance(value, bool):
            raise ValueError(f"{where}.{key}: expected true or false, got {value!r}")
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if expected in (int, float, str) and (not isinstance(value, expected) or isinstance(value, bool)):
            raise ValueError(f"{where}.{key}: expected {expected.__name__}, got {value!r}")
        if dataclasses.is_dataclass(expected):
            if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
                value = dict(value)  # a nested mapping as the config keeps it: sorted pairs
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}.{key}: expected a mapping of its keys, got {value!r}")
            value = parse_options(expected, value, f"{where}.{key}", {})
        elif typing.get_origin(expected) is tuple:
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                raise ValueError(f"{where}.{key}: expected a list, got {value!r}")
            value = tuple(str(item) for item in value)
        if key in choices and value not in choices[key]:
            raise ValueError(f"{where}.{key}: {value!r} is not one of {', '.join(map(str, choices[key]))}")
        values[key] = value
    return options_type(**values)
