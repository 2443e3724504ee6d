"""A Kaldi data directory: ``wav.scp`` (``<recording> <audio file>`` or ``<recording> <command> |``),
``text`` (``<utterance> <transcript>``), and optionally ``segments`` (``<utterance> <recording>
<start> <end>``, seconds, end -1 = to the end of the recording) and ``utt2spk`` (``<utterance>
<speaker>``; without it each utterance is its own speaker, as Kaldi assumes).

``path`` is one data directory (one part, ``all``, split by speaker) or a folder of them (Kaldi's
``data/``: each sub-folder with ``wav.scp`` and ``text`` is a part; ``train``, ``dev`` and ``test``
are the official splits when present). Fields are separated by any run of spaces and tabs, as
Kaldi reads them. ``text``, ``segments`` and ``utt2spk`` are read together in
one pass, which needs them sorted by utterance id as Kaldi requires (``LC_ALL=C sort``;
``utils/fix_data_dir.sh`` does it): an unsorted file is an error naming it. ``wav.scp`` is held
as a table of recordings while a part is read. A ``text`` line that is not UTF-8 is dropped as
``bad_encoding``; the other tables are read with undecodable bytes kept as they are (file names).
A segment whose start or end is not a finite number is dropped as ``malformed_row``.

Where paths and commands are taken: in the data directory, the folder that holds the ``wav.scp``.
A relative file name in ``wav.scp`` (or in a command) is found there, and a piped command runs
there (Kaldi itself runs both in the recipe's folder, which the import cannot know; the process's
own folder changes with whoever starts the pipeline, the data directory does not). Recipes mostly
write absolute paths, which mean the same everywhere.

Piped ``wav.scp`` entries: a command that only decodes one file (``flac -c -d -s F |``,
``sph2pipe -f wav [-p] F |``, ``sox F -t wav - |``, ``cat F |``) is replaced by the file ``F``
itself, read directly (shorten-compressed SPHERE is then converted once, see
``pipeline.data.convert``). Any other command (effects such as Kaldi's speed perturbation, channel
selection ``sph2pipe -c 2``, chains of pipes) is dropped as ``piped_command`` unless
``run_commands: true``, which runs it through the shell at import and keeps its output (a WAV),
reused while the files the command names (its words that are files: ``named_files``) keep their
size and modification time; a command that names no file is run again at every import. Archive
entries (``file.ark:123``) are dropped as ``kaldi_archive``.

The listing that fingerprints an import reads each ``wav.scp`` (never the audio) and lists, besides
the four tables, every audio file they name and the files named by the commands that will run, so
that a re-recorded file makes a new import.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.data.convert import named_files
from pipeline.data.importers import (
    CorpusImporter,
    CorpusLayoutError,
    Dropped,
    Row,
    Utterance,
    bad_encoding,
    sorted_dirs,
    text_lines,
)

DATA_FILES = ("wav.scp", "text", "segments", "utt2spk")
FLAC_OPTIONS = {"-c", "-d", "-s", "--decode", "--stdout", "--silent"}


@dataclass(frozen=True)
class KaldiOptions:
    """Options of the Kaldi data directory importer."""

    run_commands: bool = (
        False  # run piped wav.scp commands (at import, in the data directory) instead of dropping them
    )


def _is_data_dir(folder: Path) -> bool:
    return (folder / "wav.scp").is_file() and (folder / "text").is_file()


class KaldiDataDir(CorpusImporter):
    """A Kaldi data directory, or a folder of them."""

    name = "kaldi"
    Options = KaldiOptions

    def parts(self, root: Path, options) -> list[str]:
        """``all`` for a data directory, else its sub-folders that are data directories."""
        if _is_data_dir(root):
            return ["all"]
        return [p.name for p in sorted_dirs(root) if _is_data_dir(p)]

    def default_splits(self, root: Path, options) -> dict[str, list[str]] | None:
        """``train``/``dev``/``test`` sub-folders when there are any, else None (split by speaker)."""
        found = self.parts(root, options)
        if not {"train", "dev", "test"} & set(found):
            return None
        return {split: [split] if split in found else [] for split in ("train", "dev", "test")}

    def _folder(self, root: Path, part: str) -> Path:
        return root if part == "all" else root / part

    def listing(self, root: Path, parts: list[str], options) -> Iterator[Path]:
        """The data files of each part and the audio files its ``wav.scp`` names: plain entries, the
        file a decoding pipe reads, and with ``run_commands`` every file another command names (read
        from ``wav.scp``; no audio file is opened)."""
        for part in parts:
            folder = self._folder(root, part)
            for name in DATA_FILES:
                if (folder / name).is_file():
                    yield folder / name
            if (folder / "wav.scp").is_file():
                for _, entry, _ in _table(folder / "wav.scp"):
                    yield from _entry_files(entry, folder, options)

    def utterances(self, root: Path, part: str, options) -> Iterator[Row]:
        """The utterances of ``text`` in its order, with their recording, segment and speaker."""
        folder = self._folder(root, part)
        recordings = {key: (value, source) for key, value, source in _table(folder / "wav.scp")}
        segments = _Lookup(folder / "segments")
        speakers = _Lookup(folder / "utt2spk")
        for utterance, transcript, source in _table(folder / "text", sorted_keys=True, strict=True):
            if isinstance(transcript, UnicodeDecodeError):
                yield bad_encoding(source, transcript)
                continue
            segment = segments.get(utterance)
            speaker = speakers.get(utterance) if speakers.exists else utterance
            if speakers.exists and speaker is None:
                yield Dropped(source, "missing_speaker", f"utterance {utterance} is not in utt2spk")
                continue
            offset, duration, recording = 0.0, None, utterance
            if segments.exists:
                if segment is None:
                    yield Dropped(source, "missing_segment", f"utterance {utterance} is not in segments")
                    continue
                fields = segment.split()
                try:
                    recording, offset, end = fields[0], float(fields[1]), float(fields[2])
                except (IndexError, ValueError):
                    yield Dropped(
                        source,
                        "malformed_row",
                        f"segments line of {utterance} is not <recording> <start> <end>",
                    )
                    continue
                if math.isnan(offset) or math.isnan(end):
                    yield Dropped(
                        source,
                        "malformed_row",
                        f"segment of {utterance}: start {fields[1]!r} or end {fields[2]!r} is not a number",
                    )
                    continue
                if end != -1:
                    if end <= offset:
                        yield Dropped(
                            source, "malformed_row", f"segment of {utterance} ends before it starts"
                        )
                        continue
                    duration = round(end - offset, 6)
            if recording not in recordings:
                yield Dropped(source, "missing_recording", f"recording {recording} is not in wav.scp")
                continue
            entry, entry_source = recordings[recording]
            yield from _utterance(
                entry, entry_source, folder, transcript, speaker, source, offset, duration, options
            )


def _utterance(
    entry, entry_source, folder, transcript, speaker, source, offset, duration, options
) -> Iterator[Row]:
    if not entry.endswith("|"):
        if _is_archive(entry):
            yield Dropped(
                entry_source, "kaldi_archive", f"{entry!r} is an archive entry; extract it to audio files"
            )
            return
        audio = Path(entry) if Path(entry).is_absolute() else folder / entry
        yield Utterance(str(audio), transcript, speaker, source, offset, duration)
        return
    command = entry[:-1].strip()
    direct = decoded_file(command)
    if direct is not None:
        audio = Path(direct) if Path(direct).is_absolute() else folder / direct
        yield Utterance(str(audio), transcript, speaker, source, offset, duration)
    elif options.run_commands:
        yield Utterance(
            entry_source,
            transcript,
            speaker,
            source,
            offset,
            duration,
            command=command,
            command_dir=str(folder),
        )
    else:
        yield Dropped(
            entry_source,
            "piped_command",
            f"wav.scp runs {command!r}, which does more than decode one file; set run_commands: true "
            "to run it once at import and keep its output",
        )


def _entry_files(entry: str, folder: Path, options) -> Iterator[Path]:
    """The files a ``wav.scp`` entry makes the import read (relative names in ``folder``)."""
    if not entry.endswith("|"):
        if not _is_archive(entry):
            yield Path(entry) if Path(entry).is_absolute() else folder / entry
        return
    command = entry[:-1].strip()
    direct = decoded_file(command)
    if direct is not None:
        yield Path(direct) if Path(direct).is_absolute() else folder / direct
    elif options.run_commands:
        yield from named_files(command, folder)


def _is_archive(entry: str) -> bool:
    head, colon, offset = entry.rpartition(":")
    return bool(colon) and offset.isdigit() and head.endswith((".ark", ".scp"))


def decoded_file(command: str) -> str | None:
    """The one file a piped wav.scp command merely decodes, or None when the command does more."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        return None
    if not tokens or "|" in tokens:
        return None
    program, args = Path(tokens[0]).name, tokens[1:]
    files = [a for a in args if not a.startswith("-")]
    if program == "flac" and len(files) == 1 and set(args) - set(files) <= FLAC_OPTIONS:
        return files[0]
    if program == "cat" and len(args) == 1:
        return args[0]
    if program == "sph2pipe":
        rest = list(args)
        if rest[:2] == ["-f", "wav"] or rest[:2] == ["-f", "rif"]:
            rest = rest[2:]
        rest = [a for a in rest if a != "-p"]
        return rest[0] if len(rest) == 1 and not rest[0].startswith("-") else None
    if program == "sox":
        # sox [-t type] FILE -t wav -   (no effects after the output)
        rest = list(args)
        if rest[:1] == ["-t"]:
            rest = rest[2:]
        if len(rest) == 4 and rest[1:] == ["-t", "wav", "-"] and not rest[0].startswith("-"):
            return rest[0]
    return None


def _table(
    path: Path, sorted_keys: bool = False, strict: bool = False
) -> Iterator[tuple[str, str | UnicodeDecodeError, str]]:
    """(key, rest of the line, ``file:line``) of a Kaldi table file, fields split at any whitespace;
    with ``sorted_keys`` an unsorted file is a CorpusLayoutError naming the line. A line that is not
    UTF-8 comes with its UnicodeDecodeError as the rest when ``strict`` (its key as far as it decodes),
    else decoded with its odd bytes kept as they are (as Python keeps them in file names)."""
    previous = None
    for number, line in text_lines(path):
        error = None
        if isinstance(line, UnicodeDecodeError):
            error, line = line, line.object.decode("utf-8", "surrogateescape").rstrip("\r\n")
        fields = line.split(None, 1)
        if not fields:
            continue
        key, rest = fields[0], fields[1].strip() if len(fields) > 1 else ""
        if sorted_keys and previous is not None and key < previous:
            raise CorpusLayoutError(
                f"{path}:{number}: {key!r} comes after {previous!r}: the file is not sorted by utterance "
                "id as Kaldi requires (LC_ALL=C sort, or utils/fix_data_dir.sh)"
            )
        previous = key
        yield key, error if strict and error is not None else rest, f"{path}:{number}"


class _Lookup:
    """Values of a sorted Kaldi table, looked up with keys that only grow (one pass, one line held)."""

    def __init__(self, path: Path):
        self.exists = path.is_file()
        self._rows = _table(path, sorted_keys=True) if self.exists else iter(())
        self._current = next(self._rows, None)

    def get(self, key: str) -> str | None:
        """The value of ``key``, or None when the table has no such key."""
        while self._current is not None and self._current[0] < key:
            self._current = next(self._rows, None)
        if self._current is not None and self._current[0] == key:
            return self._current[1]
        return None


IMPORTER = KaldiDataDir()
