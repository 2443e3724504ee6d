"""The one place paths and fingerprints are made: every stage's output directory and fingerprint,
made once per config.

A stage's fingerprint hashes exactly the settings it depends on (``pipeline.fingerprints``) plus the
fingerprints of the stages it reads (``pipeline.dag``), so changing
``model.deepspeech.n_hidden`` moves Train and everything after it, never Features. The
file names inside a stage's directory are its file map's (``pipeline.workdir``:
``TrainRun``, ``LMFiles``, ``ExportFiles``, ...); a ``Layout`` roots each map at
its stage's fingerprinted directory and hands it out. Only the stage functions
(``pipeline.stages``) and the tasks see a ``Layout``; the code below them takes
its own map. Input files are digested through ``pipeline.digests``.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from pipeline.config import Config, ConfigError, CorpusConfig
from pipeline.config_loader import load_config
from pipeline.dag import cleans, corpus_stage, shared_alphabet, stage, task_param, upstream
from pipeline.data.importing import (
    ImportPlan,
    Listing,
    corpus_error,
    corpus_listing,
    corpus_spec,
    import_fingerprint,
    plan_import,
)
from pipeline.digests import model_digest, path_digest
from pipeline.fingerprints import derived_inputs, fingerprint_hash, node_name, stage_keys
from pipeline.workdir import (
    ALPHABET_DIR,
    CONVERTED_DIR,
    DEFAULT_ALPHABET,
    FEATURES_DIR,
    IMPORT_DIR,
    LM_DIR,
    TUNE_DIR,
    AlphabetFiles,
    CleanFiles,
    EvaluateFiles,
    ExportFiles,
    FeaturesFiles,
    ImportFiles,
    LMFiles,
    PhonemesFiles,
    TrainRun,
    TuneFiles,
    export_root,
    init_digest,
    logits_scratch,
    run_log,
    task_dir_name,
    task_export_root,
    work_directory,
)


@functools.cache
def _remembered_listing(importer, root: Path, parts: tuple[str, ...], options) -> Listing:
    # The corpus listing (one stat per file, ~3.5 s per 100,000 files) is made once per process: every
    # task's Layout asks for the Import fingerprints, and Luigi asks each task many times. A corpus
    # changed while one process runs is seen by the next run (``forget_corpus_listings`` for tests).
    return corpus_listing(importer, root, parts, options)


def forget_corpus_listings() -> None:
    """Forget the corpus listings this process made (a test that changes a corpus and runs again)."""
    _remembered_listing.cache_clear()


class Layout:
    """Every stage's directory, file names and fingerprint for one frozen config.

    Made once per config (a task, a stage function); each fingerprint is
    computed on first use and kept, and file digests are shared process-wide.
    """

    def __init__(self, config: Config, root: Layout | None = None, init_from_digest: str | None = None):
        """``init_from_digest``: the digest of ``training.init_from`` the Train fingerprint was computed
        from when the run was scheduled, for a process that trains for a run scheduled elsewhere (a
        multi-worker run's worker: ``pipeline.stages.train_worker --init-digest``); by default it is
        computed here, on first use."""
        self.config = config
        self._scheduled_init = init_from_digest
        # A task's layout (``for_task``) has the pipeline's as its root, which computes every fingerprint.
        self._root = root
        self._tasks: dict[str, Layout] = {}
        self._fingerprints: dict[tuple, str] = {}
        self._plans: dict[str, ImportPlan] = {}
        # input file -> the digest the fingerprints were computed from (the first one seen)
        self._digests_used: dict[str, str] = {}

    # -- tasks ---------------------------------------------------------------------------------
    def for_task(self, name: str) -> Layout:
        """The layout of task ``name`` of a multi-task config: its view's keys (``Config.task_view``), its
        own instances of the stages that take a task, the pipeline's Train; this layout for ``""``.
        ConfigError naming the tasks there are for a name that is not one."""
        if not name:
            return self
        root = self._root or self
        if name not in root._tasks:
            root._tasks[name] = Layout(root.config.task_view(name), root=root)
        return root._tasks[name]

    @property
    def task(self) -> str:
        """The task this layout is of (``""``: the pipeline's own)."""
        return self.config.task

    def _task_params(self, name: str) -> dict:
        """The ``task`` parameter a task's layout gives an instance of stage ``name`` (none for Train, and
        for the one alphabet every task shares)."""
        if self._root is None or "task" not in stage(name).params:
            return {}
        if name == "alphabet" and shared_alphabet(self._root.config):
            return {}
        return {"task": self.task}

    def _check_instance(self, name: str, task: str) -> None:
        """ConfigError when a multi-task config's stage that runs per task is asked for without one."""
        tasks = self.config.tasks
        if tasks and not task and "task" in stage(name).params:
            if name == "alphabet" and shared_alphabet(self.config):
                return
            raise ConfigError(
                f"{self.config.source}: a multi-task config runs {stage(name).task} once per task: give "
                f"its task (--task {' | '.join(tasks)})"
            )

    # -- roots ---------------------------------------------------------------------------------
    @functools.cached_property
    def work_dir(self) -> Path:
        """The directory that holds every stage output (``paths.work_dir``, default the XDG data home)."""
        return work_directory(self.config.paths.work_dir)

    def run_log(self, task: str) -> Path:
        """A new log file for one ``deepspeech-train`` run of ``task``:
        ``<work_dir>/logs/<time>-<task>-<pid>.log``."""
        return run_log(self.work_dir, task)

    @functools.cached_property
    def export_root(self) -> Path:
        """Where Export writes (``paths.export_dir``, default ``<work_dir>/export``); a task's export: its own
        ``paths.export_dir``, default ``<the pipeline's export root>/<task>``."""
        if self._root is not None and not self.config.multitask.task(self.task).paths.given("export_dir"):
            return task_export_root(self._root.export_root, self.task)
        return export_root(self.config.paths)

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
        """The fingerprint of one stage instance (``pipeline.dag``): a hash of the config keys
        tagged with it (input files by their digests), what the layout derives for it, and the
        fingerprints of its upstream stages. Computed once per ``Layout``."""
        if self._root is not None:  # a task's layout: the pipeline's instance with this task
            return self._root.fingerprint(stage, **{**self._task_params(stage), **params})
        params = {**{k: v for k, v in params.items() if k != "task"}, **task_param(params)}
        key = (stage, tuple(sorted(params.items())))
        if key not in self._fingerprints:
            task = params.get("task", "")
            self._check_instance(stage, task)
            own = {k: v for k, v in params.items() if k != "task"}
            view = self.for_task(task)  # the keys of the instance's task
            if stage == "alphabet" and not task and shared_alphabet(self.config):
                keys = {
                    "min_count": self.config.data.alphabet_min_count,
                    "tasks": {
                        name: stage_keys(self.for_task(name), stage, own) for name in self.config.tasks
                    },
                }
            else:
                keys = stage_keys(view, stage, own)
            self._fingerprints[key] = fingerprint_hash(
                {
                    "stage": stage,
                    "keys": keys,
                    "derived": derived_inputs(view, stage, own),
                    "upstream": {
                        node_name(name, p, task): self.fingerprint(name, **p)
                        for name, p in upstream(self.config, stage, params)
                    },
                }
            )
        return self._fingerprints[key]

    @functools.cached_property
    def init_from_digest(self) -> str | None:
        """The digest of what ``training.init_from`` loads (``workdir.init_digest``) as the Train fingerprint
        holds it: computed once per layout, when the run is scheduled (or given to the layout); None when
        the key is unset. The warm start checks the checkpoint against it when Train reads it."""
        if self._root is not None:
            return self._root.init_from_digest
        if not self.config.training.init_from:
            return None
        return self._scheduled_init or init_digest(self.config.training.init_from)

    def input_digest(self, path: str) -> str:
        """``path_digest`` of an input file, remembered as the digest this layout's fingerprints used."""
        digest = path_digest(path)
        self._digests_used.setdefault(str(path), digest)
        return digest

    def changed_inputs(self, read: dict[str, str]) -> list[str]:
        """The input files of ``read`` ({path: SHA-256 of the bytes a stage read}) whose content differs from
        what this layout's fingerprints were computed from: files edited after the run was scheduled."""
        return [path for path, digest in read.items() if self._digests_used.get(str(path), digest) != digest]

    def stage_dir(self, name: str, **params) -> Path:
        """The output folder of an instance of stage ``name`` that keeps its file map in its own module:
        ``<work_dir>/<its directory>/<its parameters' values>-<fingerprint>`` (a task's name first in a
        multi-task config's: ``align/fr-books-<fingerprint>``)."""
        declared, params = stage(name), {**self._task_params(name), **params}
        values = [str(params[p]) for p in declared.params if p != "task" and params.get(p)]
        fingerprint = self.fingerprint(name, **params)
        task = params.get("task") or ""
        return self.work_dir / declared.directory / task_dir_name("-".join([*values, fingerprint]), task)

    @functools.cached_property
    def phonemes_files(self) -> PhonemesFiles:
        """A phonemes task's IPA manifests: ``phonemes/<task>-<fingerprint>``."""
        return PhonemesFiles(self.stage_dir("phonemes"))

    def features_fingerprint(self, split: str) -> str:
        """The Features fingerprint of ``split``."""
        return self.fingerprint("features", split=split)

    @property
    def train_fingerprint(self) -> str:
        """The Train fingerprint (``training.epochs`` is not in it: raising it continues the run)."""
        return self.fingerprint("train")

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
        """The ``data.corpora`` entries by key, with their index in the list (none for a phonemes task:
        its ``of`` task imports them)."""
        if self.config.phonemes_of:
            return {}
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

    def align_files(self, key: str) -> ImportFiles:
        """The Align output directory of corpus ``key`` (a ``recordings`` corpus):
        ``align/<key>-<fingerprint>``, the files of an Import's."""
        return ImportFiles(self.stage_dir("align", corpus=key))

    def corpus_files(self, key: str) -> ImportFiles:
        """Where corpus ``key``'s manifests are: its Align folder for long recordings, else its Import's."""
        if corpus_stage(self.corpus(key)) == "align":
            return self.align_files(key)
        return self.import_files(key)

    def aligner(self, key: str) -> Path:
        """What corpus ``key``'s ``align.model`` names (a relative path is the config file's; the config
        loader checked it is given): an export directory, a ``.tflite``, or a config (``model_config``)."""
        model = Path(self.import_plan(key).options.align.model).expanduser()
        if not model.is_absolute() and Path(self.config.source).is_file():
            model = Path(self.config.source).parent / model
        return model

    # -- a model a stage runs (Align's aligner, Clean's scorer) ------------------------------------
    @staticmethod
    def model_config(named: str | Path) -> Path | None:
        """The config a model key names when it names one (a ``.yaml``/``.yml`` file: the model is that
        config's export, which its Export task builds first), else None."""
        return Path(named) if Path(named).suffix in (".yaml", ".yml") else None

    def model_path(self, named: str | Path) -> Path:
        """The model a key names: the export of a named config (ConfigError when it is not built), else
        the path itself."""
        config = self.model_config(named)
        if config is None:
            return Path(named)
        found = self._model_layout(config).find_export()
        if found is None:
            raise ConfigError(
                f"{config}: its export is not built; run: deepspeech-train Export --config {config}"
            )
        return found.root

    def model_fingerprint(self, named: str | Path) -> str:
        """What a stage running the model a key names depends on: a named config's Export fingerprint
        (known before its export is built), else the model's digest (``pipeline.digests.model_digest``)."""
        config = self.model_config(named)
        if config is None:
            return model_digest(named)
        return f"export of {config.name}: {self._model_layout(config).export_fingerprint}"

    def _model_layout(self, config: Path) -> Layout:
        """The layout of a config named as a model; ConfigError when it names configs as models itself (a
        chain, or a cycle, of configs) or exports where this config does (each would overwrite the other's
        export)."""
        named = load_config(config)
        if (
            named.data.clean.model
            and self.model_config(named.data.clean.model)
            or any(
                self.model_config(dict(dict(c.options).get("align") or {}).get("model", ""))
                for c in named.data.corpora
            )
        ):
            raise ConfigError(f"{config}: a config named as a model must not name configs as models itself")
        layout = Layout(named)
        if layout.export_root.resolve() == self.export_root.resolve():
            raise ConfigError(
                f"{self.config.source}: paths.export_dir: {self.export_root} is also the export folder of "
                f"{config}, named as a model; set another paths.export_dir"
            )
        return layout

    @functools.cached_property
    def converted_dir(self) -> Path:
        """Where imports keep the converted copies of audio libsndfile cannot read (shared by all)."""
        return self.work_dir / IMPORT_DIR / CONVERTED_DIR

    def alphabet_sources(self) -> list[tuple[tuple[str, ...], int, object]]:
        """What the Alphabet stage reads: (the train manifests, ``data.limit_train``, ``data.text``) of this
        config, or of every task when the tasks share one alphabet (``multitask.sharing: shared``)."""
        if self._root is None and shared_alphabet(self.config):
            return [source for name in self.config.tasks for source in self.for_task(name).alphabet_sources()]
        return [(self.split_manifests("train"), self.config.data.limit_train, self.config.data.text)]

    def split_manifests(self, split: str) -> tuple[str, ...]:
        """The manifests the stages read for ``split``: the Clean stage's when it cleans that split
        (``data.clean``), else its sources (``source_manifests``)."""
        if cleans(self.config, split):
            return (str(self.clean_files.manifest(split)),)
        return self.source_manifests(split)

    def source_manifests(self, split: str) -> tuple[str, ...]:
        """Every manifest of ``split`` as the data gives it: ``data.<split>_files``, then each corpus's
        (imported or aligned), in ``data.corpora`` order; a phonemes task's: its IPA manifest."""
        if self.config.phonemes_of:  # the splits its ``of`` task has
            return (str(self.phonemes_files.manifest(split)),) if self.config.has_split(split) else ()
        imported = tuple(str(self.corpus_files(key).manifest(split)) for key in self.corpora)
        return tuple(self.config.split_files(split)) + imported

    @functools.cached_property
    def clean_files(self) -> CleanFiles:
        """The Clean stage's folder: ``clean/<fingerprint>`` (``data.clean``)."""
        return CleanFiles(self.stage_dir("clean"), self.clean_scores_key())

    def clean_scores_key(self) -> str:
        """What the Clean stage's scores depend on: its fingerprint without ``max_cer`` and ``min_score``
        (the model, the splits and what gives their manifests), so that a changed threshold reuses them."""
        clean = self.config.data.clean
        node = ("clean", self._task_params("clean"))
        sources = upstream(self.config, *node)
        return fingerprint_hash(
            {
                "model": self.model_fingerprint(clean.model),
                "splits": list(clean.splits),
                # the rows are resumed by position: the manifests in their order
                "manifests": {split: list(self.source_manifests(split)) for split in clean.splits},
                "sources": {node_name(n, p, ""): self.fingerprint(n, **p) for n, p in sources},
                "files": derived_inputs(self, *node)["files"],
            }
        )

    # -- Features ------------------------------------------------------------------------------
    def features_files(self, split: str) -> FeaturesFiles:
        """The feature cache of ``split`` and its neighbours: ``features/<split>-<fingerprint>.h5``."""
        return FeaturesFiles(self.work_dir / FEATURES_DIR / f"{split}-{self.features_fingerprint(split)}.h5")

    def features_cache(self, split: str) -> Path:
        """The HDF5 cache of ``split``."""
        return self.features_files(split).cache

    def rejects_report(self, split: str) -> Path:
        """The rejects report (CSV) beside the cache of ``split``."""
        return self.features_files(split).rejects

    def features_parts(self, split: str) -> Path:
        """The folder of finished shards while ``split`` is being featurised."""
        return self.features_files(split).parts

    features_part = staticmethod(FeaturesFiles.part)

    # -- Train, LanguageModel, TuneDecoder, Evaluate -----------------------------------------
    @functools.cached_property
    def train_run(self) -> TrainRun:
        """The Train run directory (checkpoints, best-dev checkpoint, summaries, report)."""
        return TrainRun(self.stage_dir("train"))

    @functools.cached_property
    def lm(self) -> LMFiles:
        """The LanguageModel output directory (ARPA, vocabulary, report)."""
        return LMFiles(self.work_dir / LM_DIR / self.lm_fingerprint)

    @functools.cached_property
    def tune(self) -> TuneFiles:
        """The TuneDecoder output directory."""
        return TuneFiles(self.work_dir / TUNE_DIR / self.tune_fingerprint)

    @property
    def tune_dir(self) -> Path:
        """The TuneDecoder output directory's path."""
        return self.tune.root

    @property
    def tune_report(self) -> Path:
        """``tune.json``: the best alpha/beta and every trial."""
        return self.tune.report

    @functools.cached_property
    def evaluate_dir(self) -> Path:
        """The Evaluate report directory: ``evaluate/<fingerprint>`` (a task's: ``<task>-<fingerprint>``)."""
        return self.stage_dir("evaluate")

    @staticmethod
    def evaluation_report(directory: Path) -> Path:
        """``evaluation.json`` in an Evaluate output directory."""
        return EvaluateFiles(Path(directory)).report

    logits_scratch = staticmethod(logits_scratch)

    @staticmethod
    def evaluation_samples(directory: Path, lm: bool = False) -> Path:
        """``samples.jsonl`` (``samples_lm.jsonl`` with beam search + LM) in an Evaluate output directory."""
        return EvaluateFiles(Path(directory)).samples(lm)

    @staticmethod
    def evaluation_text(directory: Path) -> Path:
        """``evaluation.txt`` (the human-readable report) in an Evaluate output directory."""
        return EvaluateFiles(Path(directory)).text

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
