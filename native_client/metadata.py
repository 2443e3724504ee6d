"""The export's ``metadata.json``: what a client needs to reproduce training's input and output."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath

from native_client.alphabet import OUTPUTS, AlphabetError, Labels, make_alphabet
from native_client.features import features_from_metadata
from native_client.frontends import FeaturePipeline
from native_client.plugins import PluginError
from native_client.ranges import Range, check_decoder_settings, check_fields, value_problem
from native_client.text import TextSettings

METADATA_NAME = "metadata.json"
# SHA-256 and size of every file of an export, written last; clients and Export.complete() verify it.
MANIFEST_NAME = "manifest.json"
FORMAT = "luigi-deepspeech-export"
# 2: a front end ``type`` in ``features``, the recurrent state as a list in ``tensors["state"]``,
# ``architecture``. 3: ``output`` (``characters``, or ``bytes``: UTF-8 byte labels, ``alphabet`` empty)
# and ``text`` (the ``data.text`` settings the client applies). 4: ``stride`` (feature frames per output
# label) and ``streaming`` (what one streaming call takes; null for a model family without a streaming form,
# whose export runs whole utterances through its ``utterance`` signature). Versions 1 to 3 are read too
# (characters, no text settings before 3; one label per frame and context windows before 4). 5:
# ``features.normalize`` may be ``"global"``, with the training set's ``mean`` and ``std`` beside it (the
# client normalises). 6: a model trained with global normalisation normalises in its graph (its statistics
# are weights): ``features`` says what the client computes (``normalize: false``) and ``normalization:
# "global"`` says why. 7: ``transducer`` (a transducer's predictor and joiner: their signatures and the
# searches' settings; the streaming signatures then give the encoder's projected frames, ``joint_dim``
# wide). An export without a transducer is still written as format 6, which older clients read. Every
# earlier version is still read.
FORMAT_VERSION = 7
FORMAT_VERSION_WITHOUT_TRANSDUCER = 6
# The most feature frames one output label may stand for (a stride read from a file someone else made).
MAX_STRIDE = 64
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

# The type and range of each value a client reads (an export's manifest vouches for its files, not for
# what a hand-edited metadata.json says: every key is checked before it is used).
NUMBERS = {
    "format": Range(str),
    "format_version": Range(int, 1, FORMAT_VERSION),
    "model_version": Range(int, 0),
    "fingerprint": Range(str),
    "n_context": Range(int, 0),
    "n_input": Range(int, 1),
    "n_steps": Range(int, 1),
    "n_classes": Range(int, 2),
    "tflite_quantized": Range(bool),
    "output": Range(str),
    "n_hidden": Range(int, 1, 1 << 24),  # format 1: the LSTM's width, the size of its state
    "stride": Range(int, 1, MAX_STRIDE),
}
# decoder and the later ones: may be null
MAPPINGS = ("features", "files", "tensors", "decoder", "text", "frozen_graph", "streaming", "transducer")
# The decoder entry's names of files of the export.
DECODER_FILES = ("lm", "char_lm", "vocabulary")
# The most values a recurrent state tensor may hold (an LSTM of n_hidden 2048 holds 2,048).
MAX_STATE_VALUES = 1 << 24


class ExportError(ValueError):
    """An export directory that a client cannot use; the message says which file and why."""


class StreamInput(StrEnum):
    """What one streaming call takes: ``n_steps`` context windows of frames (DeepSpeech), or a chunk of
    frames with its look-back and look-ahead frames (Conformer)."""

    WINDOWS = "windows"
    FRAMES = "frames"


@dataclass(frozen=True)
class StreamSpec:
    """The export's streaming form (metadata.json's ``streaming`` entry, checked): ``input``, ``chunk``
    (time steps or frames a call), ``context`` (frames each side of a window), ``lookahead`` and
    ``lookback`` (frames after and before a chunk of frames)."""

    input: StreamInput
    chunk: int
    context: int = 0
    lookahead: int = 0
    lookback: int = 0

    @property
    def frames(self) -> bool:
        """Whether a call takes a chunk of frames (else context windows)."""
        return self.input is StreamInput.FRAMES

    @property
    def width(self) -> int:
        """Frames one call over chunks of frames takes: look-back, chunk and look-ahead."""
        return self.lookback + self.chunk + self.lookahead


@dataclass(frozen=True)
class TransducerSpec:
    """A transducer export's ``transducer`` entry (format 7), checked: the blank class, the predictor's
    ``context_size`` labels, the joiner's width ``joint_dim`` (the streaming signatures' output width), the
    searches' defaults (``max_symbols`` labels a frame for greedy search, ``beam`` for modified beam
    search), and the predictor's and the joiner's signatures: ``predict`` (``signature``, ``input``,
    ``output``) and ``join`` (``signature``, ``frames``, ``predicted``, ``output``)."""

    blank: int
    context_size: int
    joint_dim: int
    max_symbols: int
    beam: int
    predict: dict
    join: dict


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
    # Feature frames per output label (the model family's stride; 1 before format 4).
    stride: int = 1
    # What one streaming call takes (``StreamSpec``); None when the model has no streaming form (it runs
    # whole utterances only).
    streaming: StreamSpec | None = None
    # A transducer's predictor and joiner (format 7); None for a CTC model.
    transducer: TransducerSpec | None = None

    @property
    def output_width(self) -> int:
        """Values per time step the streaming signatures give: the CTC classes, or for a transducer the
        encoder's projected frames (``joint_dim``)."""
        return self.transducer.joint_dim if self.transducer else self.n_classes

    @property
    def seconds_per_label(self) -> float:
        """Seconds of audio each output label stands for (word timings): the frame step times the stride."""
        return self.features.seconds_per_frame * self.stride

    def output_length(self, frames: int) -> int:
        """Output labels of ``frames`` feature frames: ``ceil(frames / stride)``."""
        return -(-int(frames) // self.stride)

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
    for prefix in names or ():
        if not any(name == prefix or name.startswith(prefix.rstrip("/") + "/") for name in files):
            raise ExportError(f"{manifest}: lists no {prefix}; {redo}")
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
    _check_values(raw, directory, source)
    if raw["format"] != FORMAT:
        raise ExportError(f"{source}: format is {raw['format']!r}, expected {FORMAT!r}")
    if raw["format_version"] > FORMAT_VERSION:
        raise ExportError(
            f"{source}: format_version {raw['format_version']} is newer than this client "
            f"understands ({FORMAT_VERSION}); update the client"
        )
    features_entry = raw["features"] if isinstance(raw["features"], dict) else {}
    if raw.get("normalization") not in (None, "global") or (
        raw.get("normalization") and features_entry.get("normalize", False) is not False
    ):
        raise ExportError(
            f'{source}: normalization: expected "global" (the graph normalises; features.normalize '
            f"then false) or none, got {raw.get('normalization')!r} with features.normalize "
            f"{features_entry.get('normalize')!r}"
        )
    if raw["format_version"] >= 6 and features_entry.get("normalize") == "global":
        # Format 6 normalises in the graph (``normalization``): statistics here would be applied twice.
        raise ExportError(
            f"{source}: features: normalize: global is format 5's (the client normalised); a format "
            f"{raw['format_version']} export's graph normalises, and its features say normalize: false"
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
    if features.feature_size != raw["n_input"]:
        raise ExportError(
            f"{source}: n_input is {raw['n_input']} but the features give {features.feature_size} values per "
            f"frame"
        )
    try:
        if raw.get("text") is not None:
            check_fields(TextSettings, raw["text"], "text")
        text = TextSettings.for_client(raw["text"]) if raw.get("text") is not None else None
    except (ValueError, TypeError, AttributeError) as error:
        raise ExportError(f"{source}: {error}") from None
    return ExportMetadata(
        stride=int(raw.get("stride", 1)),
        streaming=_streaming(raw, source),
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
        transducer=_transducer(raw, source),
    )


def _check_values(raw: dict, directory: Path, source: Path) -> None:
    """ExportError naming ``source`` and the key for a value of the wrong type or range (``NUMBERS``,
    ``MAPPINGS``), a file name that leaves the export directory (``files``, ``decoder.lm``, ...), a state
    tensor that is not names and a small shape, or a decoder setting outside the config's range."""
    for key, expected in NUMBERS.items():
        if key in raw and (problem := value_problem(raw[key], expected)):
            raise ExportError(f"{source}: {key}: {problem}")
    for key in MAPPINGS:
        if key in raw and not isinstance(raw[key], dict) and (key in REQUIRED_KEYS or raw[key] is not None):
            raise ExportError(f"{source}: {key}: expected a mapping, got {raw[key]!r}")
    if not isinstance(raw["alphabet"], list) or not all(isinstance(label, str) for label in raw["alphabet"]):
        raise ExportError(f"{source}: alphabet: expected a list of characters, got {raw['alphabet']!r}")
    for kind, name in raw["files"].items():
        _check_file_name(name, f"files.{kind}", directory, source)
    decoder = raw.get("decoder") or {}
    for key in DECODER_FILES:
        if decoder.get(key) is not None:
            _check_file_name(decoder[key], f"decoder.{key}", directory, source)
    if (problem := value_problem(decoder.get("type", ""), Range(str))) is not None:
        raise ExportError(f"{source}: decoder.type: {problem}")
    try:
        check_decoder_settings(decoder, "decoder")
    except ValueError as error:
        raise ExportError(f"{source}: {error}") from None
    tensors = raw["tensors"]
    for key, value in tensors.items():
        if key != "state" and not isinstance(value, str):
            raise ExportError(f"{source}: tensors.{key}: expected a tensor name, got {value!r}")
    state = tensors.get("state", [])
    if not isinstance(state, list):
        raise ExportError(f"{source}: tensors.state: expected a list, got {state!r}")
    for index, spec in enumerate(state):
        where = f"tensors.state[{index}]"
        if not (
            isinstance(spec, dict)
            and isinstance(spec.get("input"), str)
            and isinstance(spec.get("output"), str)
        ):
            raise ExportError(f"{source}: {where}: expected input, output and shape, got {spec!r}")
        shape = spec.get("shape")
        if not (
            isinstance(shape, list)
            and shape
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape)
            and math.prod(shape) <= MAX_STATE_VALUES
        ):
            raise ExportError(
                f"{source}: {where}.shape: expected a list of sizes of at most {MAX_STATE_VALUES:,} values "
                f"in all, got {shape!r}"
            )


def _check_file_name(name, where: str, directory: Path, source: Path) -> None:
    """ExportError unless ``name`` is a relative path to a file inside ``directory`` (no ``..``, not
    absolute, not a link out of it): an export names its own files, never ``/etc/passwd``."""
    if not isinstance(name, str):
        raise ExportError(f"{source}: {where}: expected a file name, got {name!r}")
    posix = PurePosixPath(name.replace("\\", "/"))
    inside = (
        bool(name)
        and not posix.is_absolute()
        and ".." not in posix.parts
        and (directory / name).resolve().is_relative_to(directory.resolve())
    )
    if not inside:
        raise ExportError(f"{source}: {where}: {name!r} is not a file inside the export directory")


def _streaming(raw: dict, source: Path) -> StreamSpec | None:
    """The ``streaming`` entry checked and typed (before format 4: context windows of ``n_context``,
    ``n_steps`` a call); None for a model without a streaming form."""
    if "streaming" not in raw:
        return StreamSpec(StreamInput.WINDOWS, chunk=int(raw["n_steps"]), context=int(raw["n_context"]))
    entry = raw["streaming"]
    if entry is None:
        if raw["tensors"].get("state"):
            raise ExportError(
                f"{source}: streaming: null (no streaming form) but tensors.state lists a state"
            )
        return None
    kinds = [kind.value for kind in StreamInput]
    if entry.get("input") not in kinds:
        raise ExportError(
            f"{source}: streaming.input: expected one of {', '.join(kinds)}, got {entry.get('input')!r}"
        )
    entry = {"lookback": 0, **entry}  # format 4 exports before look-back frames have none
    for key, low in (("chunk", 1), ("context", 0), ("lookahead", 0), ("lookback", 0)):
        if problem := value_problem(entry.get(key), Range(int, low, 1 << 16)):
            raise ExportError(f"{source}: streaming.{key}: {problem}")
    if entry["chunk"] != raw["n_steps"] or (
        entry["input"] == StreamInput.WINDOWS and entry["context"] != raw["n_context"]
    ):
        raise ExportError(
            f"{source}: streaming: chunk and context must be n_steps and n_context, got {entry}"
        )
    stride = int(raw.get("stride", 1))
    if entry["chunk"] % stride:
        raise ExportError(
            f"{source}: streaming.chunk: {entry['chunk']} is not a multiple of the stride {stride}"
        )
    return StreamSpec(
        StreamInput(entry["input"]),
        chunk=entry["chunk"],
        context=entry["context"],
        lookahead=entry["lookahead"],
        lookback=entry["lookback"],
    )


TRANSDUCER_NUMBERS = {
    "context_size": (1, 64),
    "joint_dim": (1, 1 << 16),
    "max_symbols": (1, 64),
    "beam": (1, 1024),
}
SIGNATURE_KEYS = {
    "predict": ("signature", "input", "output"),
    "join": ("signature", "frames", "predicted", "output"),
}


def _transducer(raw: dict, source: Path) -> TransducerSpec | None:
    """The ``transducer`` entry checked and typed; None for a CTC model."""
    entry = raw.get("transducer")
    if entry is None:
        return None
    if raw["format_version"] < 7:
        raise ExportError(
            f"{source}: transducer: a format 7 entry in a format {raw['format_version']} export"
        )
    lm = [key for key in ("lm", "char_lm") if (raw.get("decoder") or {}).get(key)]
    if lm:
        raise ExportError(f"{source}: decoder.{lm[0]}: a transducer's search reads no language model")
    last = int(raw["n_classes"]) - 1  # the blank is the last class, as the head is built
    numbers = {"blank": (last, last), **TRANSDUCER_NUMBERS}
    for key, (low, high) in numbers.items():
        if problem := value_problem(entry.get(key), Range(int, low, high)):
            raise ExportError(f"{source}: transducer.{key}: {problem}")
    for part, keys in SIGNATURE_KEYS.items():
        names = entry.get(part)
        if not (isinstance(names, dict) and all(isinstance(names.get(key), str) for key in keys)):
            raise ExportError(
                f"{source}: transducer.{part}: expected the names {', '.join(keys)}, got {names!r}"
            )
    return TransducerSpec(
        **{key: int(entry[key]) for key in numbers},
        predict=dict(entry["predict"]),
        join=dict(entry["join"]),
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
