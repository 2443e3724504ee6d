"""The one copy of corpus audio the import ever makes: a file libsndfile cannot read, converted once.

Corpus audio is read where it lies, in its own format. The exceptions are formats libsndfile does
not decode: NIST SPHERE compressed with shorten (WSJ, Switchboard, Fisher as LDC ships them),
WavPack (``.wv``), AMR (``.amr``), AAC (``.m4a``) and the like. Such a file is converted once, at
import, with the first tool on ``PATH`` that succeeds: ``sph2pipe`` (for shorten SPHERE), then
``sox`` (a dependency already: WavPack, AMR, ...), then ``ffmpeg`` (nearly anything, shorten and
AAC included). The copy, FLAC (WAV from sph2pipe), is named by a hash of the source's resolved path,
size and modification time, so a changed source is converted again and an unchanged one never is.
A piped Kaldi command (``run_commands: true``) is run the same way, in the folder it is given, its
output named by a hash of the command, that folder, and the resolved path, size and modification time
of every file the command names (``named_files``): a changed input file runs the command again. A
command that names no existing file is run at every import (its output is never reused).
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
from pathlib import Path

from native_client.audio import AudioError, probe
from pipeline.files import atomic_path

TIMEOUT_S = 600


def _key(*parts: object) -> str:
    return hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=12).hexdigest()


def _tools(source: Path, target_stem: Path) -> list[tuple[str, list[str], Path]]:
    """(tool, command, output) for each converter on PATH, in the order they are tried."""
    tools = []
    if shutil.which("sph2pipe") and source.suffix.lower() in (".sph", ".wav", ".wv1", ".wv2"):
        out = target_stem.with_suffix(".wav")
        tools.append(("sph2pipe", ["sph2pipe", "-f", "wav", str(source)], out))
    if shutil.which("sox"):
        out = target_stem.with_suffix(".flac")
        tools.append(("sox", ["sox", "-V1", str(source), "-t", "flac", "{out}"], out))
    if shutil.which("ffmpeg"):
        out = target_stem.with_suffix(".flac")
        cmd = [
            "ffmpeg",
            "-nostdin",
            "-v",
            "error",
            "-y",
            "-i",
            str(source),
            "-vn",
            "-c:a",
            "flac",
            "-f",
            "flac",
            "{out}",
        ]
        tools.append(("ffmpeg", cmd, out))
    return tools


def converted_copy(source: str | Path, convert_dir: Path) -> Path:
    """The readable copy of ``source`` under ``convert_dir``, made now if there is none yet.

    Raises AudioError("unreadable_audio") naming the tools tried and what they said when none can."""
    source = Path(source)
    stat = source.stat()
    stem = convert_dir / _key(source.resolve(), stat.st_size, stat.st_mtime_ns)
    for existing in (stem.with_suffix(".flac"), stem.with_suffix(".wav")):
        if existing.is_file():
            return existing
    tried = []
    for tool, command, out in _tools(source, stem):
        try:
            with atomic_path(out, suffix=out.suffix) as tmp:
                _run_converter(tool, command, tmp)
        except _ConversionFailed as failure:
            tried.append(f"{tool}: {failure}")
            continue
        return out
    raise AudioError(
        "unreadable_audio",
        f"{source}: libsndfile cannot read it and no converter could ("
        + ("; ".join(tried) if tried else "none of sph2pipe, sox, ffmpeg is installed")
        + ")",
    )


class _ConversionFailed(Exception):
    """One converter could not convert the file (the message is its last line of errors)."""


def _run_converter(tool: str, command: list[str], tmp: Path) -> None:
    """Run one converter writing ``tmp``; _ConversionFailed unless it wrote audio libsndfile reads."""
    try:
        if tool == "sph2pipe":
            with open(tmp, "wb") as sink:
                done = subprocess.run(command, stdout=sink, stderr=subprocess.PIPE, timeout=TIMEOUT_S)
        else:
            command = [str(tmp) if part == "{out}" else part for part in command]
            done = subprocess.run(command, capture_output=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise _ConversionFailed(str(error)) from None
    if done.returncode != 0 or not _readable(tmp):
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise _ConversionFailed(lines[-1] if lines else f"exit {done.returncode}, no audio written")


def named_files(command: str, cwd: Path) -> list[Path]:
    """The existing files a shell command names, each once: its words (and what follows ``=`` in a word
    such as ``--input=FILE``) that are files, relative names taken in ``cwd``, where it runs. These are
    what its output is made from, as far as the import can tell without running it."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return []
    found: list[Path] = []
    for word in words:
        for candidate in (word, word.partition("=")[2]):
            if not candidate or candidate == "-":
                continue
            path = Path(candidate)
            path = path if path.is_absolute() else Path(cwd) / path
            if path not in found and path.is_file():
                found.append(path)
    return found


def command_output(command: str, convert_dir: Path, cwd: Path) -> Path:
    """The audio a piped Kaldi ``wav.scp`` command writes to standard output, run (through the shell, as
    Kaldi runs it) in the folder ``cwd`` and kept under ``convert_dir``, named by the command, ``cwd``
    and the stat of the files it names (``named_files``): reused while those are unchanged; a command
    that names no file is run every time. AudioError("unreadable_audio") naming the command when it
    fails or its output is not audio."""
    cwd = Path(cwd).resolve()
    sources = []
    for path in named_files(command, cwd):
        stat = path.stat()
        sources.append((str(path.resolve()), stat.st_size, stat.st_mtime_ns))
    out = convert_dir / f"{_key('command', command, cwd, *sources)}.wav"
    if sources and out.is_file():
        return out
    with atomic_path(out, suffix=".wav") as tmp:
        with open(tmp, "wb") as sink:
            try:
                done = subprocess.run(
                    command, shell=True, cwd=cwd, stdout=sink, stderr=subprocess.PIPE, timeout=TIMEOUT_S
                )  # noqa: S602 - wav.scp commands are shell pipelines by definition (Kaldi runs them the same way)
            except subprocess.TimeoutExpired:
                raise AudioError("unreadable_audio", f"command {command!r} ran over {TIMEOUT_S} s") from None
        if done.returncode != 0:
            lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
            last = lines[-1] if lines else "no message"
            raise AudioError(
                "unreadable_audio", f"command {command!r} failed (exit {done.returncode}): {last}"
            )
        if not _readable(tmp):
            raise AudioError("unreadable_audio", f"command {command!r} did not write audio libsndfile reads")
    return out


def _readable(path: Path) -> bool:
    try:
        probe(path)
    except AudioError:
        return False
    return True
