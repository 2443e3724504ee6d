"""The one map of the work directory: every stage's paths and fingerprints, made once per config.

A stage's fingerprint hashes exactly the settings it depends on plus the
fingerprints of the stages it reads, so changing ``model.n_hidden`` moves
Train and everything after it, never Features. No other module spells a stage
file name: they ask a ``Layout`` (or the ``TrainRun``/``LMFiles``/``ExportFiles``
it hands out) for paths.

Input files (manifests, alphabet, LM corpora) are digested by streaming, and a
digest is remembered for the life of the process, keyed on path, size and
modification time: Luigi calls ``output()``/``complete()`` many times per run,
and a multi-GB LM text must not be read each time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from xdg import BaseDirectory

from native_client.metadata import MANIFEST_NAME, METADATA_NAME
from pipeline.config import APP_NAME, Config, ConfigError, CorpusConfig, field_stages
from pipeline.config_loader import corpus_error
from pipeline.data.importing import (
    REJECTS_NAME,
    REPORT_NAME,
    ImportPlan,
    Listing,
    corpus_listing,
    corpus_spec,
    import_fingerprint,
    manifest_name,
    plan_import,
)
from pipeline.files import writer_tag
from pipeline.lm.kenlm_tools import find_tools
from pipeline.stages.graph import tag_applies, upstream

# English letters, space and apostrophe; package data (the checkout's data/alphabet.txt links to it).
DEFAULT_ALPHABET = Path(__file__).resolve().parent / "resources" / "alphabet.txt"
DIGEST_BLOCK = 1 << 20
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
# Under IMPORT_DIR: the one copy of corpus audio libsndfile cannot read, shared by every import.
CONVERTED_DIR = "converted"

# Checkpoint file prefixes (``ckpt-<step>``, ``best-<step>``).
CHECKPOINT_PREFIX, BEST_PREFIX = "ckpt", "best"
# LM files, in the LanguageModel directory and in an export.
WORD_ARPA, WORD_BINARY, CHAR_ARPA, VOCABULARY = "lm.arpa", "lm.binary", "chars.arpa", "vocab.txt"
# Temporary names of killed runs' leftovers (group ``pid``: the writer; ``host``: its machine, see
# files.writer_tag; names without one come from versions before host tags): files.atomic_path's
# ``.<name>.<host>-<pid>.tmp``, an export's staging directory (inside the export directory; beside it
# and its ``.old-`` twin in older versions), Evaluate's and TuneDecoder's logits scratch file.
_WRITER = r"(?:(?P<host>[^.]+)-)?(?P<pid>\d+)"
LEFTOVER_PATTERNS = (
    rf"\..+\.{_WRITER}\.tmp.*",
    rf"\.(?:.+\.)?staging-{_WRITER}",
    rf"\..+\.old-{_WRITER}",
    rf"\.logits-{_WRITER}\.h5",
)
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


def _hash_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks (memory stays flat whatever the file's size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(DIGEST_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.cache
def _remembered_digest(path: str, size: int, mtime_ns: int) -> str:
    # A pure memo: the key changes whenever the file does, so a remembered digest is never stale.
    return _hash_file(Path(path))


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (remembered per process), or ``missing`` (the stage reports that)."""
    try:
        stat = os.stat(path)
        return _remembered_digest(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    except OSError:
        return "missing"


def path_digest(path: str | Path) -> str:
    """The digest of a file (``file_digest``) or of a directory's files (their relative names and
    digests, in name order); ``missing`` when there is nothing there."""
    path = Path(path)
    if not path.is_dir():
        return file_digest(path)
    digest = hashlib.sha256()
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{item.relative_to(path).as_posix()}\n{file_digest(item)}\n".encode())
    return digest.hexdigest()


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


def init_digest(path: str | Path) -> str:
    """The digest of what ``training.init_from`` loads: a model file's own, or the files of the checkpoint
    it resolves to (a run directory's other files, such as new summaries, do not count)."""
    prefix = checkpoint_prefix(path)
    if prefix is None:
        return path_digest(path)
    digest = hashlib.sha256()
    for item in sorted(prefix.parent.glob(f"{prefix.name}.*")):
        digest.update(f"{item.name}\n{file_digest(item)}\n".encode())
    return digest.hexdigest()


@functools.cache
def _remembered_listing(importer, root: Path, parts: tuple[str, ...], options) -> Listing:
    # The corpus listing (one stat per file, ~3.5 s per 100,000 files) is made once per process: every
    # task's Layout asks for the Import fingerprints, and Luigi asks each task many times. A corpus
    # changed while one process runs is seen by the next run (``forget_corpus_listings`` for tests).
    return corpus_listing(importer, root, parts, options)


def forget_corpus_listings() -> None:
    """Forget the corpus listings this process made (a test that changes a corpus and runs again)."""
    _remembered_listing.cache_clear()


def _plain(value):
    """A config value as JSON can hold it (a group of keys or an entry of a list of mappings as a dict)."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
        return [dataclasses.asdict(item) for item in value]
    return value


def _hash(payload: dict) -> str:
    text = json.dumps(payload, sort_keys=True, default=list)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


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
    def checkpoints(self) -> Path:
        """The latest checkpoints (``tf.train.CheckpointManager``)."""
        return self.root / "checkpoints"

    @property
    def best(self) -> Path:
        """The best-dev checkpoint."""
        return self.root / "best"

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


class Layout:
    """Every stage's directory, file names and fingerprint for one frozen config.

    Made once per config (a task, a stage function); each fingerprint is
    computed on first use and kept, and file digests are shared process-wide.
    """

    def __init__(self, config: Config):
        self.config = config
        self._fingerprints: dict[tuple, str] = {}
        self._plans: dict[str, ImportPlan] = {}
        # input file -> the digest the fingerprints were computed from (the first one seen)
        self._digests_used: dict[str, str] = {}

    # -- roots ---------------------------------------------------------------------------------
    @functools.cached_property
    def work_dir(self) -> Path:
        """The directory that holds every stage output (``paths.work_dir``, default the XDG data home)."""
        if self.config.paths.work_dir:
            return Path(self.config.paths.work_dir)
        return Path(BaseDirectory.xdg_data_home) / APP_NAME

    def run_log(self, task: str) -> Path:
        """A new log file for one ``deepspeech-train`` run of ``task``:
        ``<work_dir>/logs/<time>-<task>-<pid>.log``."""
        return self.work_dir / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{task}-{os.getpid()}.log"

    @functools.cached_property
    def export_root(self) -> Path:
        """Where Export writes (``paths.export_dir``, default ``<work_dir>/export``)."""
        if self.config.paths.export_dir:
            return Path(self.config.paths.export_dir)
        return self.work_dir / EXPORT_DIR

    @functools.cached_property
    def alphabet(self) -> Path:
        """The alphabet file: the Alphabet stage's with ``paths.alphabet: auto``, else ``paths.alphabet``,
        default the packaged English one (``data/alphabet.txt``)."""
        if self.config.paths.alphabet == "auto":
            return self.alphabet_files.alphabet
        if self.config.paths.alphabet:
            return Path(self.config.paths.alphabet)
        return DEFAULT_ALPHABET

    @functools.cached_property
    def alphabet_files(self) -> AlphabetFiles:
        """The Alphabet stage's output directory: ``alphabet/<fingerprint>``."""
        return AlphabetFiles(self.work_dir / ALPHABET_DIR / self.fingerprint("alphabet"))

    # -- fingerprints --------------------------------------------------------------------------
    def fingerprint(self, stage: str, **params) -> str:
        """The fingerprint of one stage instance (``pipeline.stages.graph``): a hash of the config keys
        tagged with it (input files by their digests), what the layout derives for it, and the
        fingerprints of its upstream stages. Computed once per ``Layout``."""
        key = (stage, tuple(sorted(params.items())))
        if key not in self._fingerprints:
            self._fingerprints[key] = _hash(
                {
                    "stage": stage,
                    "keys": self._tagged_keys(stage, params),
                    "derived": self._derived(stage, params),
                    "upstream": {
                        f"{name}{sorted(p.items())}": self.fingerprint(name, **p)
                        for name, p in upstream(self.config, stage, params)
                    },
                }
            )
        return self._fingerprints[key]

    def _tagged_keys(self, stage: str, params: dict) -> dict:
        """``{"section.key": value}`` of every config key whose ``stages`` tag names this stage instance;
        a path is given with its content's digest, a front end's settings as they are written."""
        found = {}
        for section_field in dataclasses.fields(self.config):
            if section_field.name == "source":
                continue
            section = getattr(self.config, section_field.name)
            for f in dataclasses.fields(section):
                if "doc" not in f.metadata and not f.metadata.get("frontend"):
                    continue
                if f.metadata.get("frontend"):
                    tags = type(section).STAGES
                else:
                    tags = field_stages(type(section), f.name, self.config)
                if not any(tag_applies(tag, stage, params) for tag in tags):
                    continue
                value = getattr(section, f.name)
                if f.metadata.get("keyed_by"):  # only the entry this stage instance is about
                    value = tuple(item for item in value if item.key == params.get(f.metadata["keyed_by"]))
                if f.metadata.get("frontend"):
                    value = dataclasses.asdict(value)
                elif (section_field.name, f.name) == ("paths", "alphabet"):
                    value = path_digest(self.alphabet)
                elif (section_field.name, f.name) == ("training", "init_from") and value is not None:
                    value = init_digest(value)
                elif f.metadata.get("path") and value is not None:

                    def content(path, located=f.metadata.get("located")):
                        digest = self._input_digest(path)
                        return [str(path), digest] if located else digest

                    value = [content(p) for p in value] if isinstance(value, tuple) else content(value)
                found[f"{section_field.name}.{f.name}"] = _plain(value)
        return found

    def _input_digest(self, path: str) -> str:
        """``path_digest`` of an input file, remembered as the digest this layout's fingerprints used."""
        digest = path_digest(path)
        self._digests_used.setdefault(str(path), digest)
        return digest

    def changed_inputs(self, read: dict[str, str]) -> list[str]:
        """The input files of ``read`` ({path: SHA-256 of the bytes a stage read}) whose content differs from
        what this layout's fingerprints were computed from: files edited after the run was scheduled."""
        return [path for path, digest in read.items() if self._digests_used.get(str(path), digest) != digest]

    def _derived(self, stage: str, params: dict) -> dict:
        """What a stage's result depends on beyond the config's keys: the LM's builder as resolved here
        (``decoder.lm_builder: auto`` is KenLM's tools when they are installed); an Import's corpus as
        resolved (its root, parts and options) and its files' names, sizes and modification times."""
        if stage == "lm":
            return {"lm_builder": self.lm_builder}
        if stage == "import":
            return {"corpus": self.import_fingerprint(params["corpus"])}
        return {}

    def features_fingerprint(self, split: str) -> str:
        """The Features fingerprint of ``split``."""
        return self.fingerprint("features", split=split)

    @property
    def train_fingerprint(self) -> str:
        """The Train fingerprint (``training.epochs`` is not in it: raising it continues the run)."""
        return self.fingerprint("train")

    @functools.cached_property
    def lm_builder(self) -> str:
        """``kenlm`` or ``python``: ``decoder.lm_builder``, with ``auto`` resolved by whether KenLM's tools
        are installed (beside this Python or on PATH)."""
        wanted = self.config.decoder.lm_builder
        if wanted != "auto":
            return wanted
        return "kenlm" if find_tools() is not None else "python"

    @property
    def lm_fingerprint(self) -> str:
        """The LanguageModel fingerprint."""
        return self.fingerprint("lm")

    @property
    def tune_fingerprint(self) -> str:
        """The TuneDecoder fingerprint."""
        return self.fingerprint("tune")

    @property
    def evaluate_fingerprint(self) -> str:
        """The Evaluate fingerprint."""
        return self.fingerprint("evaluate")

    @property
    def export_fingerprint(self) -> str:
        """The Export fingerprint (what an export's metadata records,
        and Transcribe's records are keyed on)."""
        return self.fingerprint("export")

    # -- Import --------------------------------------------------------------------------------
    @functools.cached_property
    def corpora(self) -> dict[str, tuple[int, CorpusConfig]]:
        """The ``data.corpora`` entries by key, with their index in the list."""
        return {corpus.key: (index, corpus) for index, corpus in enumerate(self.config.data.corpora)}

    def corpus(self, key: str) -> CorpusConfig:
        """The ``data.corpora`` entry of ``key``; ConfigError naming the keys there are."""
        if key not in self.corpora:
            raise ConfigError(
                f"{self.config.source}: data.corpora has no corpus {key!r}; its corpora: "
                f"{', '.join(self.corpora) or 'none'}"
            )
        return self.corpora[key][1]

    def import_plan(self, key: str) -> ImportPlan:
        """The resolved import of corpus ``key`` (made once per layout); ConfigError naming
        ``data.corpora[i]`` when the corpus cannot be imported (e.g. its folder is missing)."""
        if key not in self._plans:
            corpus, where = self.corpus(key), f"data.corpora[{self.corpora[key][0]}]"
            if not Path(corpus.path).is_dir():
                raise ConfigError(f"{self.config.source}: {where}.path: {corpus.path}: no such corpus folder")
            try:
                self._plans[key] = plan_import(corpus_spec(corpus, self.config.data.text), where)
            except ValueError as error:
                raise corpus_error(error, where, self.config.source) from None
        return self._plans[key]

    def import_listing(self, key: str) -> Listing:
        """The listing of corpus ``key``'s files (made once per process: ``corpus_listing``'s cost);
        ConfigError naming ``data.corpora[i]`` and the path when the corpus cannot be listed (a symbolic
        link loop, an unreadable folder)."""
        plan = self.import_plan(key)
        try:
            return _remembered_listing(plan.importer, plan.root, tuple(plan.parts), plan.options)
        except ValueError as error:  # CorpusLayoutError
            raise corpus_error(error, f"data.corpora[{self.corpora[key][0]}]", self.config.source) from None

    def import_fingerprint(self, key: str) -> str:
        """The digest of corpus ``key``'s import settings and files (``pipeline.data.importing``)."""
        return import_fingerprint(self.import_plan(key), self.import_listing(key))

    def import_files(self, key: str) -> ImportFiles:
        """The Import output directory of corpus ``key``: ``imports/<key>-<fingerprint>``."""
        return ImportFiles(self.work_dir / IMPORT_DIR / f"{key}-{self.fingerprint('import', corpus=key)}")

    @functools.cached_property
    def converted_dir(self) -> Path:
        """Where imports keep the converted copies of audio libsndfile cannot read (shared by all)."""
        return self.work_dir / IMPORT_DIR / CONVERTED_DIR

    def split_manifests(self, split: str) -> tuple[str, ...]:
        """Every manifest of ``split``: ``data.<split>_files``, then each imported corpus's, in
        ``data.corpora`` order."""
        imported = tuple(str(self.import_files(key).manifest(split)) for key in self.corpora)
        return tuple(self.config.split_files(split)) + imported

    # -- Features ------------------------------------------------------------------------------
    def features_cache(self, split: str) -> Path:
        """The HDF5 cache of ``split``."""
        return self.work_dir / FEATURES_DIR / f"{split}-{self.features_fingerprint(split)}.h5"

    def rejects_report(self, split: str) -> Path:
        """The rejects report (CSV) beside the cache of ``split``."""
        cache = self.features_cache(split)
        return cache.with_name(cache.stem + ".rejects.csv")

    def features_parts(self, split: str) -> Path:
        """The folder of finished shards while ``split`` is being featurised."""
        cache = self.features_cache(split)
        return cache.with_name(cache.stem + ".parts")

    @staticmethod
    def features_part(parts: Path, index: int, key: str) -> Path:
        """Shard ``index`` inside a parts folder, made from the jobs whose digest is ``key``."""
        return parts / f"{index:05d}-{key}.npz"

    # -- Train, LanguageModel, TuneDecoder, Evaluate -----------------------------------------
    @functools.cached_property
    def train_run(self) -> TrainRun:
        """The Train run directory (checkpoints, best-dev checkpoint, summaries, report)."""
        return TrainRun(self.work_dir / TRAIN_DIR / self.train_fingerprint)

    @functools.cached_property
    def lm(self) -> LMFiles:
        """The LanguageModel output directory (ARPA, vocabulary, report)."""
        return LMFiles(self.work_dir / LM_DIR / self.lm_fingerprint)

    @functools.cached_property
    def tune_dir(self) -> Path:
        """The TuneDecoder output directory."""
        return self.work_dir / TUNE_DIR / self.tune_fingerprint

    @property
    def tune_report(self) -> Path:
        """``tune.json``: the best alpha/beta and every trial."""
        return self.tune_dir / "tune.json"

    @functools.cached_property
    def evaluate_dir(self) -> Path:
        """The Evaluate report directory."""
        return self.work_dir / EVALUATE_DIR / self.evaluate_fingerprint

    @staticmethod
    def evaluation_report(directory: Path) -> Path:
        """``evaluation.json`` in an Evaluate output directory."""
        return Path(directory) / "evaluation.json"

    @staticmethod
    def logits_scratch(directory: Path) -> Path:
        """A scratch file of logits while Evaluate or TuneDecoder runs in ``directory`` (removed after)."""
        return Path(directory) / f".logits-{writer_tag()}.h5"

    @staticmethod
    def evaluation_samples(directory: Path, lm: bool = False) -> Path:
        """``samples.jsonl`` (``samples_lm.jsonl`` with beam search + LM): every test utterance's result,
        one JSON line each, in an Evaluate output directory."""
        return Path(directory) / ("samples_lm.jsonl" if lm else "samples.jsonl")

    @staticmethod
    def evaluation_text(directory: Path) -> Path:
        """``evaluation.txt`` (the human-readable report) in an Evaluate output directory."""
        return Path(directory) / "evaluation.txt"

    # -- Export --------------------------------------------------------------------------------
    def export_destination(self, version: int | None) -> ExportFiles:
        """Where a new export goes: ``export_root`` itself, or its numbered ``version``."""
        return ExportFiles(self.export_root / str(version) if version is not None else self.export_root)

    def export_versions(self) -> list[int]:
        """The numbered versions under ``export_root`` (finished or claimed by a running export), highest
        first."""
        root = self.export_root
        numbers = (
            [int(p.name) for p in root.iterdir() if re.fullmatch(r"\d+", p.name)] if root.is_dir() else []
        )
        return sorted(numbers, reverse=True)

    def find_export(self) -> ExportFiles | None:
        """The export carrying this config's export fingerprint: ``export_root`` itself or its newest
        numbered version that matches; None when there is none."""
        candidates = [self.export_root, *(self.export_root / str(n) for n in self.export_versions())]
        for candidate in candidates:
            files = ExportFiles(candidate)
            try:
                if (
                    json.loads(files.metadata.read_text(encoding="utf-8")).get("fingerprint")
                    == self.export_fingerprint
                ):
                    return files
            except (OSError, ValueError):
                continue
        return None
