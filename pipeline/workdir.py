"""The file maps of the work directory: each stage's output files by name, and nothing else.

``pipeline.layout.Layout`` decides where each map is rooted (a stage's
fingerprinted directory) and hands the maps out; domain code takes the map it
needs (the trainer a ``TrainRun``, the LM code ``LMFiles``, the exporter
``ExportFiles``) and never the whole layout. No other module spells a stage file
name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from xdg import BaseDirectory

from native_client.metadata import MANIFEST_NAME, METADATA_NAME
from pipeline.config import APP_NAME
from pipeline.data.importing import REJECTS_NAME, REPORT_NAME, manifest_name
from pipeline.digests import file_digest, path_digest
from pipeline.files import writer_tag

# English letters, space and apostrophe; package data (the checkout's data/alphabet.txt links to it).
DEFAULT_ALPHABET = Path(__file__).resolve().parent / "resources" / "alphabet.txt"
# Stage directories under the work directory.
IMPORT_DIR, ALPHABET_DIR, FEATURES_DIR, TRAIN_DIR, LM_DIR, TUNE_DIR, EVALUATE_DIR, EXPORT_DIR = (
    "imports",
    "alphabet",
    "features",
    "train",
    "lm",
    "tune",
    "evaluate",
    "export",
)
# The Align stage's folders: a corpus of long recordings cut into utterances (pipeline.stages.align).
ALIGN_DIR = "align"
# The Clean stage's folders: the cleaned manifests and every utterance's scores (pipeline.stages.clean).
CLEAN_DIR = "clean"
# A multi-task config's phonemes tasks (targets: phonemes): their IPA manifests, under the work directory.
PHONEMES_DIR = "phonemes"
# Run logs of deepspeech-train, under the work directory.
LOGS_DIR = "logs"
# Under IMPORT_DIR: the one copy of corpus audio libsndfile cannot read, shared by every import.
CONVERTED_DIR = "converted"

# Checkpoint file prefixes (``ckpt-<step>``, ``best-<step>``; ``epoch-<epoch>``: the weights kept for
# export.average).
CHECKPOINT_PREFIX, BEST_PREFIX, EPOCH_END_PREFIX = "ckpt", "best", "epoch"
# LM files, in the LanguageModel directory and in an export.
WORD_ARPA, WORD_BINARY, CHAR_ARPA, VOCABULARY = "lm.arpa", "lm.binary", "chars.arpa", "vocab.txt"
# Temporary names of killed runs' leftovers (group ``pid``: the writer; ``host``: its machine, see
# files.writer_tag; names without one come from versions before host tags): files.atomic_path's
# ``.<name>.<host>-<pid>.tmp``, an export's staging directory (inside the export directory; beside it
# and its ``.old-`` twin in older versions), Evaluate's and TuneDecoder's logits scratch file, and an
# entry being deleted (files.remove_entry: gc, make rerun).
_WRITER = r"(?:(?P<host>[^.]+)-)?(?P<pid>\d+)"
LEFTOVER_PATTERNS = (
    rf"\..+\.{_WRITER}\.tmp.*",
    rf"\.(?:.+\.)?staging-{_WRITER}",
    rf"\..+\.old-{_WRITER}",
    rf"\.logits-{_WRITER}\.h5",
    rf"\..+\.removed-{_WRITER}",
)
# The resume state a stage keeps beside its output folder until the folder is whole (Align's aligned
# recordings): ``.<folder>.<what>``; gc removes it with the folder it belongs to.
RESUME_STATE_PATTERN = r"\.(?P<owner>.+)\.aligned"


def resume_state_owner(path: Path) -> Path | None:
    """The output folder whose resume state ``path`` is (``RESUME_STATE_PATTERN``), else None."""
    found = re.fullmatch(RESUME_STATE_PATTERN, Path(path).name)
    return Path(path).with_name(found.group("owner")) if found else None


# An entry files.remove_entry was deleting when its process died.
REMOVED_PATTERN = LEFTOVER_PATTERNS[-1]
# The staging directories inside an export directory (all made under its lock).
EXPORT_STAGING_PREFIX = ".staging-"
# File names inside an export; the client learns them from metadata.json ("files", "decoder").
EXPORT_FILES = {
    "saved_model": "saved_model",
    "frozen_graph": "output_graph.pb",
    "tflite": "model.tflite",
    "alphabet": "alphabet.txt",
    "coqui_tflite": "output_graph.tflite",  # only with export.coqui_tflite
    "model_card": "MODEL_CARD.md",
    "onnx": "model.onnx",  # only with export.onnx
}


def task_dir_name(fingerprint: str, task: str = "") -> str:
    """A stage directory's name: its fingerprint, after its task's name for a task of a multi-task config
    (``evaluate/fr-<fingerprint>``)."""
    return f"{task}-{fingerprint}" if task else fingerprint


def work_directory(configured: str) -> Path:
    """The directory that holds every stage output: ``paths.work_dir`` (``configured``), default
    ``<the XDG data home>/luigi-deepspeech``."""
    if configured:
        return Path(configured)
    return Path(BaseDirectory.xdg_data_home) / APP_NAME


def export_root(paths) -> Path:
    """Where Export writes for the paths section ``paths``: ``paths.export_dir``, default
    ``<work_dir>/export``."""
    return Path(paths.export_dir) if paths.export_dir else work_directory(paths.work_dir) / EXPORT_DIR


def task_export_root(export_root: Path, task: str) -> Path:
    """Where a task of a multi-task config exports unless it sets its own ``paths.export_dir``:
    ``<the pipeline's export root>/<task>``."""
    return Path(export_root) / task


def checkpoint_prefix(path: str | Path) -> Path | None:
    """The checkpoint a warm start reads, found without TensorFlow: ``path`` itself when it is a prefix
    (``ckpt-12`` beside ``ckpt-12.index``), else the one a ``checkpoint`` state file names in ``path``,
    its ``best/`` or its ``checkpoints/`` (a Train run directory); None when there is none."""
    path = Path(path)
    if Path(f"{path}.index").is_file():
        return path
    run = TrainRun(path)
    for directory in (path, run.best, run.checkpoints):
        state = directory / "checkpoint"
        try:
            match = re.search(r'^model_checkpoint_path:\s*"(.*)"', state.read_text(encoding="utf-8"), re.M)
        except OSError:
            continue
        if match:
            prefix = Path(match.group(1))
            prefix = prefix if prefix.is_absolute() else directory / prefix
            if Path(f"{prefix}.index").is_file():
                return prefix
    return None


def trained_on_raw_features(path: str | Path) -> bool:
    """Whether what ``training.init_from`` (``path``) loads is a checkpoint of a Train run of this project
    trained on raw features: its run's ``config.yaml`` (the checkpoint in the run's ``best/``,
    ``checkpoints/`` or ``epoch_ends/``) says ``features.normalize: false``. False for anything else: a
    checkpoint out of its run, whose features are unknown, is used as it is."""
    prefix = checkpoint_prefix(path)
    if prefix is None:
        return False
    run = TrainRun(prefix.parent.parent)
    if prefix.parent not in (run.best, run.checkpoints, run.epoch_ends):
        return False
    try:
        resolved = yaml.safe_load(run.resolved_config.read_text(encoding="utf-8"))
        return resolved["features"]["normalize"] is False
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError):
        return False


def init_digest(path: str | Path) -> str:
    """The digest of what ``training.init_from`` loads: a model file's own, or the files of the checkpoint
    it resolves to (a run directory's other files, such as new summaries, do not count). The Train
    fingerprint holds it, and the warm start checks it again when it reads the checkpoint."""
    prefix = checkpoint_prefix(path)
    if prefix is None:
        return path_digest(path)
    digest = hashlib.sha256()
    for item in sorted(prefix.parent.glob(f"{prefix.name}.*")):
        digest.update(f"{item.name}\n{file_digest(item)}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class ImportFiles:
    """The files of one Import output directory (``pipeline.data.importing`` writes them)."""

    root: Path

    def manifest(self, split: str) -> Path:
        """The DeepSpeech manifest of ``split`` (absolute audio paths, optional offset/duration/speaker)."""
        return self.root / manifest_name(split)

    @property
    def rejects(self) -> Path:
        """Every dropped row: its ``file:line``, audio, reason and detail."""
        return self.root / REJECTS_NAME

    @property
    def report(self) -> Path:
        """``report.json``: rows kept and dropped, hours and speakers per split, the files' sizes."""
        return self.root / REPORT_NAME

    def staging(self) -> Path:
        """A hidden directory beside ``root`` where an import is written before it is renamed into place."""
        return self.root.with_name(f".{self.root.name}.staging-{writer_tag()}")


@dataclass(frozen=True)
class CleanFiles:
    """The files of the Clean stage's folder, and its scores beside it."""

    root: Path
    scores_key: str

    def manifest(self, split: str) -> Path:
        """The cleaned manifest of ``split``."""
        return self.root / manifest_name(split)

    @property
    def rejects(self) -> Path:
        """The suspect rows."""
        return self.root / "rejects.csv"

    @property
    def scores(self) -> Path:
        """Every row's scores, worst first."""
        return self.root / "scores.csv"

    @property
    def report(self) -> Path:
        """``report.json``: rows kept, rejected and unscored per split, the thresholds, the files' sizes."""
        return self.root / REPORT_NAME

    def staging(self) -> Path:
        """A hidden directory beside ``root``, where the outputs are written before they are renamed in."""
        return self.root.with_name(f".{self.root.name}.staging-{writer_tag()}")

    @property
    def journal(self) -> Path:
        """Every row's scores against the model (``scores-<key>.csv`` beside the folder, ``key`` the
        model's and the data's: not the thresholds, so that a changed threshold only judges again)."""
        return self.root.with_name(f"scores-{self.scores_key}.csv")


@dataclass(frozen=True)
class PhonemesFiles:
    """The files of one Phonemes output directory: the manifests of a ``targets: phonemes`` task (its
    ``of`` task's rows, the transcripts as IPA) and the report."""

    root: Path

    def manifest(self, split: str) -> Path:
        """The manifest of ``split``: absolute audio paths, IPA transcripts."""
        return self.root / manifest_name(split)

    @property
    def report(self) -> Path:
        """``phonemes_report.json``: rows per split, the voice, espeak-ng's version (written last)."""
        return self.root / "phonemes_report.json"

    @property
    def staging(self) -> Path:
        """Where the stage writes before renaming into ``root``."""
        return self.root.with_name(self.root.name + ".partial")


@dataclass(frozen=True)
class AlphabetFiles:
    """The files of one Alphabet output directory (``paths.alphabet: auto``)."""

    root: Path

    @property
    def alphabet(self) -> Path:
        """The alphabet built from the training transcripts, in the alphabet file format."""
        return self.root / "alphabet.txt"

    @property
    def report(self) -> Path:
        """``alphabet_report.json``: every character with its count, those left out with the rows they
        cost, and the alphabet file's SHA-256 (written last)."""
        return self.root / "alphabet_report.json"


@dataclass(frozen=True)
class TrainRun:
    """The files of one Train run directory (the chief's, or a worker's scratch copy)."""

    root: Path

    @property
    def report(self) -> Path:
        """``train_report.json``: written when a run ends."""
        return self.root / "train_report.json"

    @property
    def resolved_config(self) -> Path:
        """The config the run was made with, as plain YAML."""
        return self.root / "config.yaml"

    @property
    def nonfinite_stop(self) -> Path:
        """``nonfinite_stop.json``: the record of a stop by ``training.max_nonfinite_batches``, which keeps
        the run stopped until that setting is raised (``pipeline.train.nonfinite_stop``)."""
        return self.root / "nonfinite_stop.json"

    @property
    def checkpoints(self) -> Path:
        """The latest checkpoints (``tf.train.CheckpointManager``)."""
        return self.root / "checkpoints"

    @property
    def best(self) -> Path:
        """The best-dev checkpoint."""
        return self.root / "best"

    @property
    def epoch_ends(self) -> Path:
        """The weights of the epoch ends ``export.average`` wants (``epoch-<epoch>``, weights only)."""
        return self.root / "epoch_ends"

    def epoch_end(self, epoch: int) -> Path:
        """The prefix of epoch ``epoch``'s weights in ``epoch_ends``."""
        return self.epoch_ends / f"{EPOCH_END_PREFIX}-{epoch}"

    @property
    def summaries(self) -> Path:
        """TensorBoard event files, one folder per split."""
        return self.root / "summaries"

    @property
    def logs(self) -> Path:
        """Logs of local multi-worker processes."""
        return self.root / "logs"

    def worker_log(self, index: int) -> Path:
        """The log file of local worker ``index``."""
        return self.logs / f"worker-{index}.log"

    def worker_scratch(self, index: int) -> TrainRun:
        """Where a non-chief worker saves (MultiWorkerMirroredStrategy makes every worker save)."""
        return TrainRun(self.root / f".worker-{index}")


@dataclass(frozen=True)
class FeaturesFiles:
    """The files of one split's feature cache (``features/<split>-<fingerprint>.h5`` and its neighbours)."""

    cache: Path

    @property
    def rejects(self) -> Path:
        """The rejects report (CSV) beside the cache."""
        return self.cache.with_name(self.cache.stem + ".rejects.csv")

    @property
    def parts(self) -> Path:
        """The folder of finished shards while the split is being featurised."""
        return self.cache.with_name(self.cache.stem + ".parts")

    @staticmethod
    def part(parts: Path, index: int, key: str) -> Path:
        """Shard ``index`` inside a parts folder, made from the jobs whose digest is ``key``."""
        return parts / f"{index:05d}-{key}.npz"


@dataclass(frozen=True)
class LMFiles:
    """The files of one LanguageModel output directory."""

    root: Path

    @property
    def report(self) -> Path:
        """``lm_report.json``: written last, so its presence means the stage finished."""
        return self.root / "lm_report.json"

    @property
    def word_arpa(self) -> Path:
        """The word n-gram model built here (ARPA)."""
        return self.root / WORD_ARPA

    @property
    def char_arpa(self) -> Path:
        """The character n-gram model (lexicon-free decoding)."""
        return self.root / CHAR_ARPA

    @property
    def word_binary(self) -> Path:
        """The word n-gram model as a KenLM trie binary (what the KenLM builder ships)."""
        return self.root / WORD_BINARY

    @property
    def vocabulary(self) -> Path:
        """One word per line, most frequent first."""
        return self.root / VOCABULARY

    @property
    def filtered_arpa(self) -> Path:
        """The word ARPA limited to ``decoder.lm_top_k`` words (a step before the binary)."""
        return self.root / "lm.filtered.arpa"

    @property
    def sort_space(self) -> Path:
        """Where lmplz spills its sort (removed when the stage ends)."""
        return self.root / "lmplz-tmp"

    @property
    def build_log(self) -> Path:
        """The output of KenLM's tools."""
        return self.root / "kenlm.log"

    @property
    def staging(self) -> Path:
        """Where the stage assembles its files before renaming them into ``root``."""
        return self.root.with_name(self.root.name + ".partial")

    def resolve(self, name: str) -> Path:
        """A file a report names: absolute as given (``decoder.lm_path``), else inside ``root``."""
        value = Path(name)
        return value if value.is_absolute() else self.root / value


@dataclass(frozen=True)
class TuneFiles:
    """The files of one TuneDecoder output directory."""

    root: Path

    @property
    def report(self) -> Path:
        """``tune.json``: the best alpha/beta and every trial."""
        return self.root / "tune.json"


@dataclass(frozen=True)
class EvaluateFiles:
    """The files of one Evaluate output directory."""

    root: Path

    @property
    def report(self) -> Path:
        """``evaluation.json``."""
        return self.root / "evaluation.json"

    @property
    def text(self) -> Path:
        """``evaluation.txt``: the human-readable report."""
        return self.root / "evaluation.txt"

    def samples(self, lm: bool = False) -> Path:
        """``samples.jsonl`` (``samples_lm.jsonl`` with beam search + LM): every test utterance's result,
        one JSON line each."""
        return self.root / ("samples_lm.jsonl" if lm else "samples.jsonl")


def logits_scratch(directory: Path) -> Path:
    """A scratch file of logits while Evaluate or TuneDecoder runs in ``directory`` (removed after)."""
    return Path(directory) / f".logits-{writer_tag()}.h5"


def run_log(work_dir: Path, task: str) -> Path:
    """A new log file for one ``deepspeech-train`` run of ``task``:
    ``<work_dir>/logs/<time>-<task>-<pid>.log``."""
    return Path(work_dir) / LOGS_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}-{task}-{os.getpid()}.log"


def retry_mark(work_dir: Path, name: str) -> Path:
    """A mark that a task's failure is final (``tasks.retries``), left by the task's process for its Luigi
    worker: ``<work_dir>/logs/.final-errors/<name>``."""
    return Path(work_dir) / LOGS_DIR / ".final-errors" / name


@dataclass(frozen=True)
class ExportFiles:
    """The files of one export directory (``paths.export_dir`` or one numbered version)."""

    root: Path

    @property
    def metadata(self) -> Path:
        """``metadata.json``: what a client needs (written last)."""
        return self.root / METADATA_NAME

    def file(self, kind: str) -> Path:
        """One of ``EXPORT_FILES`` (``saved_model``, ``frozen_graph``, ``tflite``, ``alphabet``)."""
        return self.root / EXPORT_FILES[kind]

    @property
    def transcripts(self) -> Path:
        """Where Transcribe writes its JSON records."""
        return self.root / "transcripts"

    def transcript(self, audio: str | Path, export_fingerprint: str) -> Path:
        """The record of one audio file by the export of ``export_fingerprint``: the file's stem plus a hash
        of its resolved path, its content (``file_digest``: remembered per size and modification time) and
        the fingerprint, so neither a changed export nor a changed file is answered by an old record."""
        audio = Path(audio).resolve()
        key = hashlib.sha256(f"{audio}\n{file_digest(audio)}\n{export_fingerprint}".encode()).hexdigest()[:10]
        return self.transcripts / f"{audio.stem}-{key}.json"

    def staging(self) -> Path:
        """A hidden directory inside ``root`` where a new export is assembled: on the same file system as
        the export, also when ``root`` is a mount point."""
        return self.root / f"{EXPORT_STAGING_PREFIX}{writer_tag()}"

    def written_entries(self) -> list[str]:
        """The top-level names this export wrote, from its manifest (plus the manifest itself); empty when
        there is no readable manifest (a directory holding no export of ours)."""
        try:
            listed = json.loads((self.root / MANIFEST_NAME).read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        return sorted({name.split("/", 1)[0] for name in listed} | {MANIFEST_NAME})
