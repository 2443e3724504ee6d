"""The export's ``metadata.json``: what a client needs to reproduce training's input and output."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from native_client.alphabet import OUTPUTS, AlphabetError, Labels, make_alphabet
from native_client.features import features_from_metadata
from native_client.frontends import FeaturePipeline
from native_client.plugins import PluginError
from native_client.text import TextSettings

METADATA_NAME = "metadata.json"
# SHA-256 and size of every file of an export, written last; clients and Export.complete() verify it.
MANIFEST_NAME = "manifest.json"
FORMAT = "luigi-deepspeech-export"
# 2: a front end ``type`` in ``features``, the recurrent state as a list in ``tensors["state"]``,
# ``architecture``. 3: ``output`` (``characters``, or ``bytes``: UTF-8 byte labels, ``alphabet`` empty)
# and ``text`` (the ``data.text`` settings the client applies). Versions 1 and 2 are read too (characters,
# no text settings).
FORMAT_VERSION = 3
REQUIRED_KEYS = (
    "format",
    "format_version",
    "model_version",
    "fingerprint",
    "features",
    "n_context",
    "n_input",
    "n_steps",
    "n_classes",
    "alphabet",
    "files",
    "tensors",
)


class ExportError(ValueError):
    """An export directory that a client cannot use; the message says which file and why."""


@dataclass(frozen=True)
class ExportMetadata:
    """Parsed ``metadata.json``; ``directory`` is the export it came from."""

    directory: Path
    model_version: int
    fingerprint: str
    features: FeaturePipeline
    n_context: int
    n_input: int
    n_steps: int
    n_classes: int
    alphabet: Labels
    files: dict
    tensors: dict
    tflite_quantized: bool = False
    decoder: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict, repr=False)
    # The text settings training used (``data.text``, without its digits policy); None before format 3.
    text: TextSettings | None = None

    @property
    def output(self) -> str:
        """``characters`` or ``bytes``: what the model's labels stand for."""
        return self.alphabet.output

    @property
    def state(self) -> list[dict]:
        """The recurrent state tensors: ``{"input", "output", "shape"}`` each, in call order."""
        return self.tensors["state"]

    def path(self, kind: str) -> Path:
        """Path of one of the exported files (``saved_model``, ``frozen_graph``, ``tflite``, ...)."""
        if kind not in self.files:
            raise ExportError(f"{self.directory / METADATA_NAME}: lists no {kind!r} file")
        return self.directory / self.files[kind]


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path) -> dict:
    """Record the SHA-256 and size of every file below ``directory`` in its ``manifest.json``."""
    directory = Path(directory)
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_NAME):
        files[path.relative_to(directory).as_posix()] = {
            "sha256": sha256_file(path),
            "size": path.stat().st_size,
        }
    (directory / MANIFEST_NAME).write_text(json.dumps({"files": files}, indent=1) + "\n", encoding="utf-8")
    return files


def verify_manifest(directory: Path, names=None, digest=sha256_file) -> None:
    """Check files of the export in ``directory`` against its manifest: ``names`` (relative paths; a
    directory name covers what is below it), or every listed file. Raises ExportError naming the first
    file that is missing, has another size or another SHA-256. ``digest(path)`` may remember digests."""
    directory = Path(directory)
    manifest = directory / MANIFEST_NAME
    redo = "the export is damaged or was edited; export again (make rerun STAGE=Export)"
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        raise ExportError(f"{manifest}: missing, so the export's files cannot be verified; {redo}") from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ExportError(f"{manifest}: unreadable ({error}); {redo}") from None
    wanted = (
        list(files)
        if names is None
        else [
            name
            for name in files
            for prefix in names
            if name == prefix or name.startswith(prefix.rstrip("/") + "/")
        ]
    )
    if names is not None and not wanted:
        raise ExportError(f"{manifest}: lists none of {', '.join(names)}; {redo}")
    for name in wanted:
        path, entry = directory / name, files[name]
        try:
            size = path.stat().st_size
        except OSError:
            raise ExportError(f"{path}: missing; {redo}") from None
        if size != entry["size"]:
            raise ExportError(f"{path}: {size} bytes, the manifest says {entry['size']}; {redo}")
        if digest(path) != entry["sha256"]:
            raise ExportError(f"{path}: its SHA-256 differs from the manifest's; {redo}")


def _numbered_versions(directory: Path) -> list[Path]:
    return sorted(
        (p for p in directory.iterdir() if re.fullmatch(r"\d+", p.name) and (p / METADATA_NAME).is_file()),
        key=lambda p: int(p.name),
    )


def resolve_export_dir(directory: str | Path) -> Path:
    """The export in ``directory``: itself when it holds ``metadata.json``,
    else its highest numbered version."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ExportError(f"{directory}: no such export directory")
    if (directory / METADATA_NAME).is_file():
        return directory
    versions = _numbered_versions(directory)
    if versions:
        return versions[-1]
    raise ExportError(
        f"{directory}: no {METADATA_NAME} here or in a numbered version below it; "
        f"this is not a model export (create one with the Export task)"
    )


def parse_metadata(raw: dict, directory: Path, plugins: Iterable[str] = ()) -> ExportMetadata:
    """Check and parse the metadata dict; errors name the file and the key. ``plugins``: the dotted
    names of implementations of one's own the export may use (see ``features_from_metadata``)."""
    source = directory / METADATA_NAME
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    if missing:
        raise ExportError(f"{source}: missing keys: {', '.join(missing)}")
    if raw["format"] != FORMAT:
        raise ExportError(f"{source}: format is {raw['format']!r}, expected {FORMAT!r}")
    if raw["format_version"] > FORMAT_VERSION:
        raise ExportError(
            f"{source}: format_version {raw['format_version']} is newer than this client "
            f"understands ({FORMAT_VERSION}); update the client"
        )
    try:
        features = features_from_metadata(raw["features"], plugins)
    except (KeyError, ValueError, TypeError, PluginError) as error:
        detail = f"missing key {error.args[0]!r}" if isinstance(error, KeyError) else str(error)
        raise ExportError(f"{source}: features: {detail}") from None
    output = raw.get("output", "characters")
    if output not in OUTPUTS:
        raise ExportError(f"{source}: output: {output!r} is not one of {', '.join(OUTPUTS)}")
    try:
        alphabet = make_alphabet(output, raw["alphabet"])
    except (AlphabetError, TypeError) as error:
        raise ExportError(f"{source}: alphabet: {error}") from None
    if alphabet.n_classes != raw["n_classes"]:
        raise ExportError(
            f"{source}: {output} outputs have {alphabet.size} labels but n_classes is {raw['n_classes']} "
            f"(expected labels + 1 for the CTC blank)"
        )
    try:
        text = TextSettings.for_client(raw["text"]) if raw.get("text") is not None else None
    except (ValueError, TypeError, AttributeError) as error:
        raise ExportError(f"{source}: {error}") from None
    return ExportMetadata(
        directory=directory,
        model_version=int(raw["model_version"]),
        fingerprint=raw["fingerprint"],
        features=features,
        n_context=int(raw["n_context"]),
        n_input=int(raw["n_input"]),
        n_steps=int(raw["n_steps"]),
        n_classes=int(raw["n_classes"]),
        alphabet=alphabet,
        files=dict(raw["files"]),
        tensors=_tensors(raw, source),
        tflite_quantized=bool(raw.get("tflite_quantized", False)),
        decoder=dict(raw.get("decoder") or {}),
        raw=raw,
        text=text,
    )


def _tensors(raw: dict, source: Path) -> dict:
    """The ``tensors`` entry with the state as a list (version 1 named an LSTM's two tensors)."""
    tensors = dict(raw["tensors"])
    if "state" not in tensors:
        if "n_hidden" not in raw or "state_h" not in tensors:
            raise ExportError(f"{source}: tensors: no 'state' list")
        shape = [1, int(raw["n_hidden"])]
        tensors["state"] = [
            {"input": tensors[f"state_{k}"], "output": tensors[f"new_state_{k}"], "shape": shape}
            for k in ("h", "c")
        ]
    return tensors


def load_metadata(directory: str | Path, plugins: Iterable[str] = ()) -> ExportMetadata:
    """Read and check the metadata of the export in ``directory`` (see ``resolve_export_dir``);
    ``plugins``: see ``parse_metadata``."""
    directory = resolve_export_dir(directory)
    source = directory / METADATA_NAME
    verify_manifest(directory, [METADATA_NAME])
    try:
        raw = json.loads(source.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ExportError(f"{source}: not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise ExportError(f"{source}: expected a JSON object")
    return parse_metadata(raw, directory, plugins)
