"""The configuration schema: frozen dataclasses, one per section, each field with its doc and range.

Reading YAML into these (``extends:``, type checks, error messages) is
``pipeline.config_loader``; this module only says what a config is.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from native_client.ranges import DECODER_SETTINGS, SAMPLE_RATE
from native_client.text import TextSettings

APP_NAME = "luigi-deepspeech"


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message is one line."""


def _opt(
    default,
    doc: str,
    *,
    minimum=None,
    maximum=None,
    path: bool = False,
    stages=None,
    exclusive_min: bool = False,
    mapping: bool = False,
    when=None,
    located: bool = False,
    required: bool = False,
    rest: bool = False,
    keyed_by: str | None = None,
    keywords: tuple = (),
    override: str | None = None,
    override_keys: tuple = (),
):
    """A dataclass field with its documentation, range, and the stages whose output it changes.

    ``stages``: names of stages (``pipeline.dag``) that re-run when the key
    changes, a name with ``:<param>`` (``"features:train"``) for one instance of a
    stage; ``()`` for a key that changes no result (worker counts, timings); None
    for the section's ``STAGES``. Each stage's fingerprint is made of exactly the
    keys that name it (``Layout``), so this is the one place that says it.
    ``when``: ``{tag: predicate(config)}``, the key feeds that stage only where the
    predicate holds (``augment.freq_mask_max`` matters to Train only with masks on).
    A path is fingerprinted by its content; ``located``: by its place too (a manifest,
    whose relative audio paths resolve from its folder).
    ``mapping``: the value is a mapping of settings (kept as sorted (key, value) pairs).
    ``required``: the key must be given (in an entry of a list of mappings).
    ``rest``: a mapping that takes every key of the entry the schema does not name (a plug-in's options).
    ``keyed_by``: a list of entries each of which feeds one instance of the tagged stage, the one whose
    parameter of that name is the entry's ``key`` (its fingerprint takes that entry only).
    ``keywords``: words a path key also takes, kept as they are (``paths.alphabet: auto``).
    ``override``: the name of a section whose keys the value overrides (a multitask task's ``data:``), read
    key by key as that section's (only ``override_keys`` when given) into a ``SectionOverride``.
    """
    meta = {
        "doc": doc,
        "min": minimum,
        "max": maximum,
        "path": path,
        "stages": stages,
        "exclusive_min": exclusive_min,
        "mapping": mapping,
        "when": dict(when or {}),
        "located": located,
        "required": required,
        "rest": rest,
        "keyed_by": keyed_by,
        "keywords": tuple(keywords),
        "override": override,
        "override_keys": tuple(override_keys),
    }
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for sequence defaults")
    return field(default=default, metadata=meta)


def field_stages(section: type, name: str, config: Config | None = None) -> tuple[str, ...]:
    """The stages a key of ``section`` feeds: its own ``stages`` tag, else the section's ``STAGES``;
    with ``config``, only those whose ``when`` guard holds for it."""
    meta = {f.name: f for f in fields(section)}[name].metadata
    stages = tuple(section.STAGES if meta.get("stages") is None else meta["stages"])
    if config is None:
        return stages
    guards = meta.get("when") or {}
    return tuple(tag for tag in stages if tag not in guards or guards[tag](config))


# Guards of keys that matter to a stage only in some configs (``_opt(when=...)``).
# Their docstrings are what docs/CONFIGURATION.md says of the condition.
def _features_augmented(config: Config) -> bool:
    """with feature-level augmentation on"""
    return config.augment.features_on


def _audio_copies(config: Config) -> bool:
    """with audio copies on"""
    return config.augment.copies > 0


def _lm_reads_train(config: Config) -> bool:
    """with decoder.lm_include_train"""
    return config.decoder.lm_include_train


def _kenlm_builds(config: Config) -> bool:
    """when KenLM's tools build the LM"""
    return config.decoder.lm_builder != "python" and not config.decoder.lm_path


def _char_lm(config: Config) -> bool:
    """with decoder.lexicon off"""
    return not config.decoder.lexicon


def _best_not_by_loss(config: Config) -> bool:
    """when not dev_loss"""
    return config.training.best_by != "dev_loss"


def _cosine(config: Config) -> bool:
    """with lr_decay: cosine"""
    return config.training.lr_decay == "cosine"


def _bucketing(config: Config) -> bool:
    """when set"""
    return bool(config.training.bucket_growth)


def _warming_up(config: Config) -> bool:
    """when set"""
    return config.training.warmup_steps > 0


def _accumulates(config: Config) -> bool:
    """when above 1"""
    return config.training.accumulate_batches != 1


def _alphabet_file(config: Config) -> bool:
    """with character outputs and an alphabet file"""
    return config.model.output == "characters" and not config.alphabet_auto


@dataclass(frozen=True)
class PathsConfig:
    """Where inputs are and where every stage writes."""

    STAGES: ClassVar[tuple[str, ...]] = ()

    work_dir: str | None = _opt(
        None,
        "Directory for all stage outputs; default: <XDG data home>/luigi-deepspeech.",
        path=True,
        stages=(),
    )
    export_dir: str | None = _opt(
        None,
        "Where Export writes the deployable model; default <work_dir>/export.",
        path=True,
        stages=(),
    )
    alphabet: str | None = _opt(
        None,
        "Alphabet file, one character per line (LF or CRLF, UTF-8, a byte-order mark is ignored); auto: the "
        "Alphabet stage builds it from the normalised training transcripts (docs/LANGUAGES.md); default: the "
        "project's data/alphabet.txt (English). Not used with model.output: bytes.",
        path=True,
        stages=("features", "lm"),
        when={"features": _alphabet_file, "lm": _alphabet_file},
        keywords=("auto",),
    )


@dataclass(frozen=True)
class CorpusConfig:
    """A corpus imported from its own layout: one entry of ``data.corpora``. Any other key of the entry is
    an option of its importer (docs/DATA.md lists them, e.g. ``train_from_validated: true`` for
    common_voice)."""

    # Importer options that are paths, resolved from the file that wrote them as path keys are.
    OPTION_PATHS: ClassVar[tuple[str, ...]] = ("align.model",)

    importer: str = _opt(
        "",
        "The importer that reads the corpus's layout: librispeech, mls, common_voice, tedlium, timit, "
        "mailabs, kaldi, folder, recordings (long recordings with their whole text, cut into utterances "
        "by the Align stage with the model its align: settings name; docs/DATA.md) (modules of "
        "pipeline/data/importers/), or the dotted name of a module of your own defining IMPORTER.",
        required=True,
    )
    path: str = _opt("", "The corpus folder, as its release unpacks.", path=True, required=True)
    train: tuple[str, ...] | None = _opt(
        None,
        "The corpus parts that make the training split (e.g. [train-clean-100, train-clean-360]); default: "
        "the importer's official ones. A corpus without official splits is split by speaker.",
    )
    dev: tuple[str, ...] | None = _opt(None, "The parts that make the dev split; default: the official ones.")
    test: tuple[str, ...] | None = _opt(
        None, "The parts that make the test split; default: the official ones."
    )
    split_fractions: tuple = _opt(
        (("dev", 0.05), ("test", 0.05), ("train", 0.9)),
        "Corpora without official splits: the share of speakers (not utterances) each split gets, by a "
        "hash of the speaker id, as a mapping {train: 0.9, dev: 0.05, test: 0.05} adding up to 1.",
        mapping=True,
    )
    salt: str = _opt("", "Speaker-hash splits: another salt puts other speakers in dev and test.")
    name: str | None = _opt(
        None,
        "The corpus's key: the Import task's --corpus and its folder under <work_dir>/imports "
        "(default <importer>-<folder name>).",
    )
    options: tuple = _opt(
        (),
        "The importer's own options, as a mapping; they may also be written as keys of the entry itself.",
        mapping=True,
        rest=True,
    )

    @property
    def key(self) -> str:
        """The corpus's key: ``name``, else ``<importer>-<folder name>`` (characters other than letters,
        digits, ``.``, ``_`` and ``-`` as ``_``)."""
        key = self.name or f"{self.importer.rsplit('.', 1)[-1]}-{Path(self.path).name}"
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", key)

    def named_splits(self) -> dict[str, tuple[str, ...]]:
        """The parts of each split the entry names (splits it leaves out take the importer's defaults)."""
        named = {split: getattr(self, split) for split in ("train", "dev", "test")}
        return {split: parts for split, parts in named.items() if parts is not None}


@dataclass(frozen=True)
class CleanConfig:
    """``data.clean``: the Clean stage, which scores every transcript of the cleaned splits against a model
    and leaves out those it does not believe (docs/DATA.md "Finding wrong transcripts")."""

    STAGES: ClassVar[tuple[str, ...]] = ("clean",)

    model: str | None = _opt(
        None,
        "The model that scores the transcripts: an export directory of this project, or a DeepSpeech/Coqui "
        ".tflite (its alphabet from its own metadata). Unset (default): no Clean stage.",
        path=True,
    )
    max_cer: float = _opt(
        0.5,
        "Reject an utterance whose greedy character error rate against the model's transcript is above this.",
        minimum=0.0,
    )
    min_score: float = _opt(
        -5.0,
        "... or whose forced-alignment score (the log-probability of its transcript's best CTC path, per "
        "character: 0 is certain) is below this. On the sample, right transcripts score -0.5 to -5 and "
        "swapped ones -7 to -11 (docs/DATA.md).",
        maximum=0.0,
    )
    splits: tuple[str, ...] = _opt(
        ("train", "dev"),
        "The splits cleaned. Not test by default: cleaning the test split would flatter the reported "
        "accuracy.",
    )


@dataclass(frozen=True)
class DataConfig:
    """The corpus: DeepSpeech CSV manifests per split, and corpora imported from their own layouts."""

    STAGES: ClassVar[tuple[str, ...]] = ("features",)

    train_files: tuple[str, ...] = _opt(
        (),
        "Training CSVs (wav_filename,wav_filesize,transcript).",
        path=True,
        located=True,
        stages=("features:train", "lm", "alphabet"),
        when={"lm": _lm_reads_train},
    )
    dev_files: tuple[str, ...] = _opt(
        (),
        "Validation CSVs, used for dev loss, early stopping and the best-dev checkpoint. Empty: Train runs "
        "without validation (early stopping and plateau halving off, with a warning) and the last "
        "checkpoint is the one Evaluate and Export use. decoder.tune needs them.",
        path=True,
        located=True,
        stages=("features:dev",),
    )
    test_files: tuple[str, ...] = _opt(
        (), "Test CSVs, used by Evaluate.", path=True, located=True, stages=("features:test",)
    )
    limit_train: int = _opt(
        0,
        "Use at most this many training samples (0 = all).",
        minimum=0,
        stages=("features:train", "lm", "alphabet"),
        when={"lm": _lm_reads_train},
    )
    limit_dev: int = _opt(
        0, "Use at most this many dev samples (0 = all).", minimum=0, stages=("features:dev",)
    )
    limit_test: int = _opt(
        0, "Use at most this many test samples (0 = all).", minimum=0, stages=("features:test",)
    )
    corpora: tuple[CorpusConfig, ...] = _opt(
        (),
        "Corpora in their own layout (LibriSpeech, Common Voice, a folder of audio with .txt files, ...), "
        "a list of mappings with the keys below; an Import task per corpus (an Align task for one with "
        "align: settings) writes its train/dev/test manifests, which follow data.train_files, "
        "data.dev_files and data.test_files in their splits.",
        stages=("import", "align"),
        keyed_by="corpus",
    )
    text: TextSettings = _opt(
        TextSettings(),
        "How every transcript is normalised (the keys below): those of data.corpora and of the manifests of "
        "data.*_files, the LM text, and the client's (the export records them). One function does it: "
        "native_client/text.py (docs/LANGUAGES.md).",
        stages=("import", "alphabet", "features", "lm", "export"),
    )
    alphabet_min_count: int = _opt(
        1,
        "With paths.alphabet: auto: characters seen fewer times than this in the training transcripts are "
        "left out of the alphabet (listed in the Alphabet report with the rows they cost, which Features "
        "then rejects as unknown_characters). Raise it (e.g. 5) for crowd-sourced corpora with stray "
        "foreign characters.",
        minimum=1,
        stages=("alphabet",),
    )
    max_reject_fraction: float = _opt(
        0.05,
        "Fail a split when more than this fraction of its manifest rows is rejected (augmented copies are "
        "not counted; a split with no usable row fails whatever this says; checked after extraction; raising "
        "it reuses the extracted features). The rows an Import rejected for the split count too (a missing, "
        "empty or unreadable file, an empty transcript, ...), unless data.limit_<split> is set; the rows a "
        "corpus leaves out by design (Common Voice's held-out speakers, TIMIT's dialect sentences) never do.",
        minimum=0.0,
        maximum=1.0,
        stages=(),
    )
    clean: CleanConfig = _opt(
        CleanConfig(),
        "The Clean stage (off unless its model is set): the keys below.",
        stages=("clean",),
    )
    max_duration_s: float = _opt(
        40.0,
        "Reject utterances longer than this many seconds (reason too_long, told from the header before "
        "decoding); 0 = no limit. 40 s keeps every utterance of LibriSpeech (the longest is 35 s), Common "
        "Voice and TED-LIUM's segments, while a batch's memory in training grows with its longest "
        "utterance (a 220 s one took 4.1 GB at n_hidden 2048); Features reads any length in blocks.",
        minimum=0.0,
    )


def _default_frontend():
    from native_client.frontends.mfcc import MfccSettings

    return MfccSettings()


@dataclass(frozen=True)
class FeaturesConfig:
    """Audio checks and the feature front end. The keys of the front end that ``type`` names (the tables
    below: numcep, nfilt, winlen, ... for mfcc) go in this section too."""

    STAGES: ClassVar[tuple[str, ...]] = ("features",)

    type: str = _opt(
        "mfcc",
        "The feature front end: a module of native_client/frontends/ (mfcc, logfbank, "
        "deepspeech) or the dotted name of a module of your own defining FRONTEND.",
    )
    sample_rate: int = _opt(
        16000, "Expected sample rate in Hz.", minimum=SAMPLE_RATE.minimum, maximum=SAMPLE_RATE.maximum
    )
    resample: bool = _opt(
        True,
        "Resample audio of another rate to sample_rate (soxr), as DeepSpeech's importers converted "
        "everything; false rejects it as wrong_sample_rate. The Features report counts the files resampled.",
    )
    downmix: bool = _opt(
        True,
        "Average multi-channel audio to mono; false rejects it as too_many_channels. The Features report "
        "counts the files downmixed.",
    )
    normalize: Literal[False, True, "global"] = _opt(
        False,
        "Feature normalisation. true: each utterance to zero mean, unit variance with its own statistics "
        "(a streaming client must wait for the utterance's end). global: with the mean and standard "
        "deviation of each coefficient over the train split's features (computed once as its cache is "
        "written; a multi-task config pools every task's train split), weights of the model's first layer, "
        "which normalises each frame in training and in the export's graph: a model that streams. "
        "false: none.",
    )
    workers: int = _opt(
        0,
        "Extraction worker processes (0 = all cores); also the espeak-ng processes of a phonemes task.",
        minimum=0,
        stages=(),
    )
    # The front end's own settings (its Settings dataclass), filled by the loader from the section's
    # other keys.
    frontend: Any = field(default_factory=_default_frontend, metadata={"frontend": True})

    def __post_init__(self):
        from native_client.frontends import frontend_class

        if type(self.frontend) is not frontend_class(self.type).Settings:
            raise ConfigError(
                f"features.type is {self.type!r} but its settings are {type(self.frontend).__name__}"
            )

    def __getattr__(self, name: str):
        # The front end's settings read like the section's own keys, as they are written in YAML.
        if name != "frontend" and "frontend" in self.__dict__ and hasattr(self.frontend, name):
            return getattr(self.frontend, name)
        raise AttributeError(f"features has no key {name!r}")


def family_option(default, doc: str, *, minimum=None, maximum=None, exclusive_min: bool = False, stages=None):
    """A field of a model family's ``Settings`` (``model.<family>.<key>``): its doc and range, as the
    schema's own keys carry them; ``stages=()`` for a setting that changes no result (not fingerprinted)."""
    return _opt(default, doc, minimum=minimum, maximum=maximum, exclusive_min=exclusive_min, stages=stages)


def is_deepspeech(architecture: str) -> bool:
    """Whether ``model.architecture`` names the deepspeech family (by its name or its module's)."""
    return architecture in ("deepspeech", "pipeline.model.deepspeech")


def _own_objective(config: Config) -> bool:
    """with a model.objective other than ctc"""
    return config.model.objective != "ctc"


def objective_name(name: str) -> str:
    """A ``model.objective`` as one objective is named: a built-in one by its short name (``ctc``, not
    ``pipeline.model.objectives.ctc``)."""
    return name.removeprefix("pipeline.model.objectives.")


def is_transducer(config: Config) -> bool:
    """with model.objective: transducer (the built-in one; the only objective the config loader lets
    through whose output is not CTC's label scores)"""
    return objective_name(config.model.objective) == "transducer"


@dataclass(frozen=True)
class TransducerConfig:
    """``model.transducer``: the predictor and joiner of ``model.objective: transducer`` (icefall's
    stateless predictor; docs/TRAINING.md "The transducer")."""

    STAGES: ClassVar[tuple[str, ...]] = ("train",)

    context_size: int = _opt(
        2,
        "Labels the stateless predictor sees: the last context_size (1: the last label only).",
        minimum=1,
        maximum=8,
    )
    predictor_dim: int = _opt(256, "Width of the predictor's label embeddings and output.", minimum=1)
    predictor_groups: int = _opt(
        64,
        "Groups of the predictor's convolution over its context (icefall: predictor_dim / 4); must divide "
        "predictor_dim.",
        minimum=1,
    )
    joint_dim: int = _opt(
        256,
        "Width of the joiner: the encoder's and the predictor's projections, added, tanh, for every pair "
        "of a frame and a label count in training: with the scores over the classes, the memory to watch "
        "(max_joint_mib).",
        minimum=1,
    )
    max_symbols: int = _opt(
        4,
        "Greedy search: at most this many labels a frame (the dev figures in training, the export's greedy "
        "search).",
        minimum=1,
    )
    max_joint_mib: float = _opt(
        4096.0,
        "Cap in MiB on one tower's joiner in training, estimated as batch x frames x (labels + 1) pairs of "
        "4 x joint_dim hidden values (the compute dtype: with their gradients) and 3 x classes float32 "
        "scores (with their log-softmax and gradient): a batch over it is cut into smaller steps, and an "
        "utterance over it alone is refused before training starts. Set it to what the device has left "
        "beside the encoder.",
        minimum=0.0,
        exclusive_min=True,
    )


@dataclass(frozen=True)
class ModelConfig:
    """The acoustic model: its family, its objective and the keys every family shares. A family's own
    settings go under ``model.<family>:`` (the tables after this one); those of a family that is not chosen
    are neither checked nor fingerprinted, so a config may extend one of another family. DeepSpeech's may
    also be written as the section's own keys (model.n_hidden), as DeepSpeech's configs write them."""

    STAGES: ClassVar[tuple[str, ...]] = ("train",)

    architecture: str = _opt(
        "deepspeech",
        "The model family: a module of pipeline/model/ (deepspeech, conformer) or the "
        "dotted name of a module of your own defining FAMILY. A family that emits a label per several "
        "frames also re-runs FeaturesSplit: its too-short check counts the family's labels.",
    )
    objective: str = _opt(
        "ctc",
        "What the model is trained to minimise: a module of pipeline/model/objectives/ (ctc; transducer, "
        "exported with its predictor and joiner, decoded without an LM: docs/TRAINING.md) or the dotted name "
        "of a module of your own defining OBJECTIVE. One whose too-short rule is not CTC's also re-runs "
        "FeaturesSplit.",
        when={"train": _own_objective},
    )

    random_seed: int = _opt(4567, "Seed for weight initialisation and data order.")
    output: Literal["characters", "bytes"] = _opt(
        "characters",
        "What the model emits: characters (the alphabet's labels), or bytes: the UTF-8 bytes of the text, "
        "255 labels plus the blank as DeepSpeech's --bytes_output_mode, for scripts with thousands of "
        "characters (Chinese, Japanese); paths.alphabet is then not used.",
        stages=("features", "lm", "train"),
    )
    transducer: TransducerConfig = _opt(
        TransducerConfig(),
        "The transducer's predictor and joiner (the keys below); read with model.objective: transducer.",
        when={"train": is_transducer},
    )
    # The chosen family's own settings (its Settings dataclass, filled by the loader from
    # ``model.<family>:``), or () for a family without them.
    options: Any = field(default=(), metadata={"family": True})


@dataclass(frozen=True)
class TrainingConfig:
    """The training loop."""

    STAGES: ClassVar[tuple[str, ...]] = ("train",)

    epochs: int = _opt(
        75,
        "Target epoch count. Negative, -N: N more epochs than the run has when this value is first used "
        "on it; the same -N asked again (Train rerun) trains nothing more, a different -M adds M from "
        "where the run stands. A run that stopped early stays stopped. Not in the Train fingerprint: "
        "changing it continues the same run.",
        stages=("tune", "evaluate", "export"),
    )
    batch_size: int = _opt(16, "Batch size per tower (global batch = batch_size x towers).", minimum=1)
    global_batch_size: int = _opt(
        0,
        "If set: the global batch, split evenly over the towers (must divide); 0 = batch_size x towers.",
        minimum=0,
    )
    dev_batch_size: int = _opt(
        16,
        "Batch size per tower for dev and test passes (each utterance's result does not depend on it).",
        minimum=1,
        stages=(),
    )
    accumulate_batches: int = _opt(
        1,
        "Gradient aggregation: average the gradients of this many batches before one optimizer update, "
        "the update of one batch this many times the size (a large batch on a small device). Global steps, "
        "checkpoint_steps and the epochs' batches count batches; the learning-rate schedule (decay_steps) "
        "counts updates; checkpoints are saved between updates only. With multitask a window is this many "
        "steps of the task schedule (docs/TRAINING.md).",
        minimum=1,
        when={"train": _accumulates},
    )
    learning_rate: float = _opt(0.001, "Adam learning rate.", minimum=0.0, exclusive_min=True)
    beta1: float = _opt(0.9, "Adam beta1.", minimum=0.0, maximum=1.0)
    beta2: float = _opt(0.999, "Adam beta2.", minimum=0.0, maximum=1.0)
    epsilon: float = _opt(1e-8, "Adam epsilon.", minimum=0.0, exclusive_min=True)
    lr_decay: Literal["constant", "exponential", "noam", "cosine"] = _opt(
        "constant",
        "Learning-rate schedule after the warm-up (warmup_steps), counting optimizer updates: constant; "
        "exponential (decay_rate per decay_steps, from the first update); noam (ESPnet's and WeNet's: "
        "learning_rate x sqrt(warmup_steps / update), so learning_rate is the peak; needs warmup_steps); "
        "cosine (half a cosine from learning_rate down to min_learning_rate at the run's last update, "
        "training.epochs x the updates of an epoch: a new epoch target reshapes the rest of the curve). "
        "halve_lr_on_plateau multiplies into every schedule.",
    )
    min_learning_rate: float = _opt(
        0.0,
        "The learning rate lr_decay: cosine ends at (below learning_rate).",
        minimum=0.0,
        # Read by the cosine schedule only, so in Train's fingerprint only with it.
        when={"train": _cosine},
    )
    decay_rate: float = _opt(
        0.95, "Exponential decay factor per decay_steps.", minimum=0.0, maximum=1.0, exclusive_min=True
    )
    decay_steps: int = _opt(
        1000, "Optimizer updates per decay_rate factor (steps, unless accumulate_batches is set).", minimum=1
    )
    warmup_steps: int = _opt(
        0,
        "Raise the learning rate linearly from learning_rate / warmup_steps to learning_rate over the first "
        "this many optimizer updates (0 = no warm-up). Attention models (the conformer family) train badly "
        "without one.",
        minimum=0,
        # In the fingerprint only when set: runs from before the key keep their directories.
        when={"train": _warming_up},
    )
    halve_lr_on_plateau: bool = _opt(
        False, "Halve the learning rate when the dev loss is worse than the best so far."
    )
    clip_grad_norm: float = _opt(0.0, "Clip gradients by global norm (0 = off).", minimum=0.0)
    revert_nonfinite_updates: bool = _opt(
        True,
        "Undo an update that would make any weight non-finite "
        "(keeps one copy of the weights and optimizer slots).",
        stages=(),
    )
    max_nonfinite_batches: int = _opt(
        10, "Stop after this many consecutive batches with a non-finite loss.", minimum=1, stages=()
    )
    checkpoint_secs: int = _opt(
        600, "Save a checkpoint at least this often (and at each epoch end).", minimum=1, stages=()
    )
    checkpoint_steps: int = _opt(
        0,
        "Also save a checkpoint after every global step that is a multiple of this (0 = by "
        "checkpoint_secs and epoch ends only): saves at known steps, whatever the machine's speed.",
        minimum=0,
        stages=(),
    )
    hooks: tuple[str, ...] = _opt(
        (),
        "Modules of your own (dotted names) whose TRAIN_HOOKS(config) returns a "
        "pipeline.train.hooks.TrainHooks, called after each step, validation and epoch in every "
        "training process; they observe (in no fingerprint) and may stop training with StopTraining.",
        stages=(),
    )
    max_to_keep: int = _opt(5, "Latest checkpoints kept.", minimum=1, stages=())
    validation_epochs: int = _opt(1, "Validate every this many epochs (0 = never).", minimum=0)
    best_by: Literal["dev_loss", "cer", "wer"] = _opt(
        "dev_loss",
        "The validation figure that picks the best checkpoint, the one Evaluate and Export use: dev_loss "
        "(DeepSpeech's), or the lowest dev cer or wer (the earlier of equals). The loss can rise while the "
        "error rates still fall (the model grows over-confident on the words it gets wrong). Early stopping "
        "and halve_lr_on_plateau always read the dev loss.",
        # In the fingerprint only when set: runs from before the key keep their directories.
        when={"train": _best_not_by_loss},
    )
    report_count: int = _opt(10, "Best and worst samples listed in reports.", minimum=0, stages=())
    summary_secs: int = _opt(60, "Write histogram summaries at most this often.", minimum=1, stages=())
    wer_log_pattern: str | None = _opt(
        None,
        "A str.format pattern printed after each validation with epoch, wer, cer, loss.",
        stages=(),
    )
    init_from: str | None = _opt(
        None,
        "Warm start from this checkpoint directory or Train run (weights only); "
        "the deepspeech family also reads a DeepSpeech 0.7+/Coqui STT .tflite model "
        "or a DeepSpeech 0.6+/Coqui TF1 checkpoint directory.",
        path=True,
    )
    drop_source_layers: int = _opt(
        0, "With init_from: re-initialise this many last layers (new alphabet).", minimum=0, maximum=6
    )
    shuffle_seed: int = _opt(1234, "Seed of the per-epoch batch order.")
    precision: Literal["float32", "mixed_bfloat16", "mixed_float16"] = _opt(
        "float32",
        "Keras mixed-precision policy of the training step: "
        "variables and checkpoints stay float32 (a run can switch and resume), "
        "the CTC loss and softmax are float32, mixed_float16 scales the loss; the export is float32.",
        stages=(),
    )
    jit_compile: bool = _opt(
        False,
        "Compile the training step with XLA: with distribution.strategy one_device (what auto picks for "
        "one GPU or one CPU device) the whole step, forward, backward and update; with the other "
        "strategies the forward and backward pass.",
        stages=(),
    )
    deterministic: Literal["auto", "exact", "fast"] = _opt(
        "auto",
        "exact: TensorFlow's op determinism on (and TF32 off on GPUs), so a run and a resumed run give the "
        "same weights bit for bit, with the slower deterministic GPU kernels; fast: TensorFlow's defaults "
        "(on a GPU, runs differ in the last bits); auto: exact without a GPU, fast with "
        '(docs/RELIABILITY.md "What is exact where").',
        stages=(),
    )
    max_batch_frames: int = _opt(
        0,
        "Cap on the frames of one tower's batch (batch size x longest utterance, padded to its grid "
        "value with bucket_growth); "
        "a batch over it is split into smaller steps. 0 = off.",
        minimum=0,
    )
    bucket_growth: float = _opt(
        0.0,
        'Pad every batch to a fixed grid of shapes (docs/TRAINING.md "Bucketed shapes"): frames up to a '
        "grid of multiples of 8 growing by at most this factor a step (1.1: at most 10%, or 7 frames), "
        "labels to a width per grid value, batch sizes fixed per value; an epoch of the sample has 22 shapes "
        "instead of 142. Each new shape is one XLA compile with jit_compile and one cuDNN autotuning on "
        "a GPU. Padding changes no loss or gradient, but dropout and feature noise draw over the padded "
        "shape: another run. 0 = off: each batch padded to its own longest.",
        minimum=0.0,
        # Read only when set; a cap (max_batch_frames) then counts the padded frames.
        when={"train": _bucketing},
    )


@dataclass(frozen=True)
class EarlyStopConfig:
    """When to stop before the target epoch."""

    STAGES: ClassVar[tuple[str, ...]] = ("train",)

    rule: Literal["seed", "patience", "off"] = _opt(
        "off", "seed: DeepSpeech's mean/std rule; patience: es_epochs without es_min_delta gain."
    )
    earlystop_nsteps: int = _opt(4, "Seed rule: dev losses considered.", minimum=2)
    estop_mean_thresh: float = _opt(0.5, "Seed rule: |latest - mean| below this...", minimum=0.0)
    estop_std_thresh: float = _opt(0.5, "Seed rule: ...and std below this stops.", minimum=0.0)
    es_epochs: int = _opt(5, "Patience rule: validations without improvement before stopping.", minimum=1)
    es_min_delta: float = _opt(0.0, "Patience rule: the least improvement that counts.", minimum=0.0)


@dataclass(frozen=True)
class DistributionConfig:
    """Devices and workers ("towers")."""

    STAGES: ClassVar[tuple[str, ...]] = ("train",)

    strategy: Literal["auto", "one_device", "mirrored", "multi_worker"] = _opt(
        "auto", "auto: all local GPUs as towers, else the CPU."
    )
    cpu_devices: int = _opt(
        0,
        "Split the CPU into this many logical devices (towers without GPUs; 0 = no split). Like the "
        "number of GPUs, not in the Train fingerprint: a run resumed on other towers continues when its "
        "batch plan is the same (training.global_batch_size) or at an epoch boundary, and is refused "
        "mid-epoch otherwise.",
        minimum=0,
        stages=(),
    )
    local_workers: int = _opt(
        0,
        "With strategy multi_worker: the Train task starts this many worker processes on this machine "
        "(0: this process is one worker, TF_CONFIG says which).",
        minimum=0,
    )
    collective_timeout_s: float = _opt(
        120.0,
        "multi_worker: seconds a collective operation may wait for the other workers before failing.",
        minimum=1.0,
        stages=(),
    )
    cluster: Literal["tf_config", "slurm"] = _opt(
        "tf_config",
        "multi_worker without local_workers: where this worker learns the cluster. tf_config: the TF_CONFIG "
        "variable (set by hand, or per pod by Kubeflow's TFJob: configs/k8s-tfjob.yaml); slurm: the Slurm "
        "job step it runs in (srun; configs/slurm.sbatch), through TensorFlow's SlurmClusterResolver. Never "
        "guessed from SLURM_* variables: every sbatch job has them, also one training alone.",
        stages=(),
    )
    port_base: int = _opt(
        0,
        "cluster slurm: the first port of a node's workers (the next ones on that node follow); 0: 20000 + "
        "8 x (SLURM_JOB_ID mod 1500), so that two jobs sharing a node (up to 8 tasks each) do not collide, "
        "below Linux's ephemeral ports (32768-60999). A node's ports (this one and one per further task on "
        "the node) must stay within 1-65535.",
        minimum=0,
        maximum=65535,
        stages=(),
    )


def _card_given(config: Config) -> bool:
    """when any export.card key is set"""
    return config.export.card != CardConfig()


def _averaging(config: Config) -> bool:
    """when set"""
    return config.export.average.count > 0


def _onnx(config: Config) -> bool:
    """with export.onnx"""
    return config.export.onnx


@dataclass(frozen=True)
class CardConfig:
    """The export's model card (``MODEL_CARD.md`` and the ``card`` entry of ``metadata.json``): Coqui STT's
    model metadata fields, filled from these keys and from the stages' reports."""

    name: str = _opt("", "The model's name (Coqui's model_name); default: the config file's name.")
    version: str = _opt("", "The model's version (Coqui's model_version); default: the export's number.")
    language: str = _opt(
        "", "IETF BCP 47 tag of the model's language (en-US, de-DE); default: data.text.language, else und."
    )
    license: str = _opt("", "SPDX identifier of the model's licence (MPL-2.0, CC-BY-4.0).")
    author: str = _opt("", "Who made the model (Coqui's author: a person or an organisation).")
    contact: str = _opt("", "How to reach the author (Coqui's contact_info: e-mail, issue tracker).")
    description: str = _opt("", "Free text: what the model is for, its known limits (Markdown).")
    training_data: str = _opt(
        "",
        "Free text: what the training data is (corpora, their licences, speakers); the card adds the "
        "samples and hours Train read.",
    )
    evaluation: bool = _opt(
        False,
        "Put Evaluate's test-set figures (greedy, and with the decoder and its settings) in the card: Export "
        "then runs after Evaluate.",
    )


@dataclass(frozen=True)
class AverageConfig:
    """Checkpoint averaging: the model TuneDecoder, Evaluate and Export use is the mean of the weights of
    several epoch-end checkpoints of the Train run instead of the single best-dev one. Give one key."""

    last: int = _opt(
        0, "Average the checkpoints of the run's last this-many epochs (0 = not this way).", minimum=0
    )
    best: int = _opt(
        0,
        "Average the checkpoints of the this-many epochs with the best training.best_by dev figure (0 = not "
        "this way); needs validation.",
        minimum=0,
    )

    @property
    def count(self) -> int:
        """The checkpoints asked for (0: no averaging)."""
        return self.last or self.best

    @property
    def mode(self) -> str:
        """``last`` or ``best`` (the key that is set), ``""`` without averaging."""
        return "last" if self.last else "best" if self.best else ""


@dataclass(frozen=True)
class ExportConfig:
    """The deployable model."""

    STAGES: ClassVar[tuple[str, ...]] = ("export",)

    n_steps: int = _opt(
        16,
        "Feature frames per streaming call (a multiple of the model family's stride; a family without a "
        "streaming form ignores it, and so does the conformer, whose calls are model.conformer.chunk_frames "
        "labels).",
        minimum=1,
    )
    quantize: bool = _opt(False, "Dynamic-range int8 quantisation of the TFLite model.")
    versioned: bool = _opt(False, "Keep numbered versions under export_dir.")
    coqui_tflite: bool = _opt(
        False,
        "Also write output_graph.tflite in the DeepSpeech 0.9 / Coqui STT layout (their tensor names, MFCC "
        "subgraph and metadata), which their clients and apps load; needs features.type deepspeech with its "
        "filterbank defaults and the deepspeech family.",
    )
    card: CardConfig = _opt(
        CardConfig(),
        'The model card\'s fields, as a mapping of the keys below (docs/CLIENT.md "The model card"); every '
        "export has a card, these fill in what the pipeline cannot know.",
        when={"export": _card_given},
    )
    onnx: bool = _opt(
        False,
        "Also write model.onnx: the streaming step (state as inputs and outputs) in float, converted from "
        "the SavedModel by tf2onnx (the onnx extra: pip install -e '.[onnx]'); the client runs it with "
        "onnxruntime (--model model.onnx).",
        when={"export": _onnx},
    )
    average: AverageConfig = _opt(
        AverageConfig(),
        "Checkpoint averaging, {last: N} or {best: N}: TuneDecoder, Evaluate and Export use the mean of the "
        "weights of N epoch-end checkpoints, and Evaluate reports the dev figures of that mean beside the "
        "single best's. Train keeps those N checkpoints (whatever training.max_to_keep) while it runs with "
        "this set; a run trained without it averages those it still has, and says so. With multitask, each "
        "task's model (the shared part and its head or network) is averaged over the same checkpoints, best "
        "ranked by the tasks' weighted mean (docs/TRAINING.md).",
        stages=("tune", "evaluate", "export"),
        when={"tune": _averaging, "evaluate": _averaging, "export": _averaging},
    )


@dataclass(frozen=True)
class DecoderConfig:
    """The language model and the decoder (CTC beam search by default)."""

    STAGES: ClassVar[tuple[str, ...]] = ("lm",)

    type: str = _opt(
        "beam",
        "The decoder of Evaluate's LM figures, TuneDecoder, the export and the client: beam (CTC beam "
        "search with the LM, flashlight-text), greedy (best path, no LM), or the dotted path of a module of "
        "your own whose DECODER is a native_client.decoders.Decoder.",
        stages=("tune", "evaluate", "export"),
    )
    lm_corpus_files: tuple[str, ...] = _opt(
        (), "Text files the LanguageModel task learns from (never dev or test text).", path=True
    )
    lm_include_train: bool = _opt(True, "Add the training transcripts to the LM text.")
    lm_order: int = _opt(
        3, "n-gram order of the word LM (KenLM as packaged here reads up to 6).", minimum=1, maximum=6
    )
    char_lm_order: int = _opt(
        6,
        "n-gram order of the character LM used when lexicon is false (at most 6).",
        minimum=1,
        maximum=6,
        when={"lm": _char_lm},
    )
    lm_path: str | None = _opt(
        None, "An existing ARPA or KenLM binary to use instead of building one.", path=True
    )
    lm_builder: Literal["auto", "kenlm", "python"] = _opt(
        "auto",
        "Who estimates the LM: kenlm (KenLM's lmplz + build_binary, see make kenlm; refused where they are "
        "not installed), python (the built-in estimator, for small corpora), auto (kenlm when its tools are "
        "installed, else python; the LM's report says which, and the fingerprint is the same either way).",
    )
    lm_memory: str = _opt(
        "2G",
        "KenLM builder: memory for lmplz's sort (its -S: 2G, 500M, 50%); it spills to disk beyond.",
        stages=(),
    )
    lm_prune: tuple[int, ...] = _opt(
        (),
        "KenLM builder: lmplz --prune thresholds per order, "
        "e.g. [0, 0, 1] drops trigrams seen once (non-decreasing).",
        minimum=0,
        when={"lm": _kenlm_builds},
    )
    lm_top_k: int = _opt(
        0,
        "KenLM builder: keep only the LM's n-grams of the this-many most frequent words (0 = all), "
        "as DeepSpeech's generate_lm.py.",
        minimum=0,
        when={"lm": _kenlm_builds},
    )
    lm_quantize_bits: int = _opt(
        8,
        "KenLM builder: build_binary quantisation bits (-q, pointer compression -a 255), 0 = none.",
        minimum=0,
        maximum=16,
        when={"lm": _kenlm_builds},
    )
    # The ranges of the settings an export records are the client's (native_client.ranges), so that it
    # refuses what this schema refuses.
    beam_width: int = _opt(
        256,
        "CTC beam width.",
        minimum=DECODER_SETTINGS["beam_width"].minimum,
        stages=("tune", "evaluate", "export"),
    )
    beam_threshold: float = _opt(
        15.0,
        "Prune hypotheses whose score is this far below the best.",
        minimum=DECODER_SETTINGS["beam_threshold"].minimum,
        stages=("tune", "evaluate", "export"),
    )
    beam_size_token: int = _opt(
        8,
        "Tokens (most likely first) tried per frame for each hypothesis; 0 = all.",
        minimum=DECODER_SETTINGS["beam_size_token"].minimum,
        stages=("tune", "evaluate", "export"),
    )
    lm_alpha: float = _opt(
        1.5, "LM weight (TuneDecoder starts its search here).", stages=("tune", "evaluate", "export")
    )
    lm_beta: float = _opt(
        2.25,
        "Word insertion weight (TuneDecoder starts its search here).",
        stages=("tune", "evaluate", "export"),
    )
    lexicon: bool = _opt(
        True,
        "Lexicon decoding: words from the LM vocabulary, scored by the word LM. "
        "false: lexicon-free, any spelling, scored by a character LM.",
        stages=("lm", "tune", "evaluate", "export"),
    )
    tune: bool = _opt(False, "Tune lm_alpha/lm_beta on the dev set.", stages=("evaluate", "export"))
    tune_trials: int = _opt(30, "Trials of the alpha/beta search.", minimum=1, stages=("tune",))
    workers: int = _opt(
        0,
        "Processes that beam-decode in Evaluate and TuneDecoder (0 = all cores).",
        minimum=0,
        stages=(),
    )


@dataclass(frozen=True)
class AugmentConfig:
    """Data augmentation of the training split (never dev or test). Feature-level keys act on the cached
    features inside tf.data, per batch (they feed Train); audio-level keys make extra cached copies of
    the training utterances (they feed the train Features)."""

    STAGES: ClassVar[tuple[str, ...]] = ("train",)

    freq_masks: int = _opt(
        0,
        "SpecAugment: frequency masks per utterance (0 = none).",
        minimum=0,
        when={"train": _features_augmented},
    )
    freq_mask_max: int = _opt(
        4,
        "SpecAugment: the widest frequency mask, in feature coefficients.",
        minimum=1,
        when={"train": _features_augmented},
    )
    time_masks: int = _opt(
        0, "SpecAugment: time masks per utterance (0 = none).", minimum=0, when={"train": _features_augmented}
    )
    time_mask_max: int = _opt(
        40,
        "SpecAugment: the widest time mask, in feature frames.",
        minimum=1,
        when={"train": _features_augmented},
    )
    time_mask_fraction: float = _opt(
        0.1,
        "SpecAugment: a time mask covers at most this fraction of its utterance.",
        minimum=0.0,
        maximum=1.0,
        exclusive_min=True,
        when={"train": _features_augmented},
    )
    feature_noise_std: float = _opt(
        0.0,
        "Gaussian noise of this standard deviation added to the features (0 = none); with "
        "features.normalize: global, in units of each coefficient's deviation over the training set.",
        minimum=0.0,
        when={"train": _features_augmented},
    )
    seed: int = _opt(
        2024,
        "Seed of every augmentation draw (with the epoch and step, or the utterance and copy).",
        stages=("train", "features:train"),
        when={"train": _features_augmented, "features:train": _audio_copies},
    )
    speed_factors: tuple[float, ...] = _opt(
        (),
        "Audio: one extra copy of every training utterance per factor, "
        "resampled to play that much faster (e.g. [0.9, 1.1]).",
        minimum=0.5,
        maximum=2.0,
        stages=("features:train",),
        when={"features:train": _audio_copies},
    )
    audio_copies: int = _opt(
        0,
        "Audio: extra copies at the original speed (with gain_db and noise_dir).",
        minimum=0,
        stages=("features:train",),
        when={"features:train": _audio_copies},
    )
    gain_db: float = _opt(
        0.0,
        "Audio: each copy's volume changes by a random gain within +-gain_db decibels.",
        minimum=0.0,
        stages=("features:train",),
        when={"features:train": _audio_copies},
    )
    noise_dir: str | None = _opt(
        None,
        "Audio: a folder of noise recordings (WAV/FLAC at the sample rate); "
        "a random one is mixed into each copy.",
        path=True,
        stages=("features:train",),
        when={"features:train": _audio_copies},
    )
    noise_snr_db: tuple[float, ...] = _opt(
        (10.0, 30.0),
        "Audio: the range [low, high] of the signal-to-noise ratio of mixed noise, in dB.",
        stages=("features:train",),
        when={"features:train": _audio_copies},
    )

    @property
    def features_on(self) -> bool:
        """Whether any feature-level augmentation is on."""
        return bool(self.freq_masks or self.time_masks or self.feature_noise_std)

    @property
    def copies(self) -> int:
        """Extra cached copies of each training utterance (audio-level augmentation)."""
        return len(self.speed_factors) + self.audio_copies


def _multitask(config: Config) -> bool:
    """in a multi-task config"""
    return bool(config.multitask.tasks)


# The transcripts of a phonemes task (IPA from espeak-ng) are normalised with these settings: its symbols
# kept as they are (no case folding), punctuation (espeak-ng's liaison marks) as spaces.
PHONEME_TEXT = TextSettings(case="keep", keep_punctuation="")


@dataclass(frozen=True)
class SectionOverride:
    """The keys a task of ``multitask.tasks`` gives for one section (its ``data:``, ``paths:``, ``decoder:``
    or ``model:``), each checked as that section's key when the config loads; ``apply`` puts them over the
    top-level section. A nested group of keys (``data: {text: {language: fr}}``) is itself an override of
    the keys it gives."""

    values: tuple = ()  # ((key, value or SectionOverride), ...) in the order written

    def given(self, key: str) -> bool:
        """Whether the task sets ``key``."""
        return any(name == key for name, _ in self.values)

    def apply(self, section):
        """``section`` with these keys in place of its own."""
        if not self.values:
            return section
        return dataclasses.replace(
            section,
            **{
                key: value.apply(getattr(section, key)) if isinstance(value, SectionOverride) else value
                for key, value in self.values
            },
        )

    def to_dict(self) -> dict:
        """The keys as the YAML file writes them."""

        def plain(value):
            if isinstance(value, SectionOverride):
                return value.to_dict()
            if isinstance(value, tuple):
                return [dataclasses.asdict(v) if is_dataclass(v) else plain(v) for v in value]
            return value

        return {key: plain(value) for key, value in self.values}


@dataclass(frozen=True)
class TaskConfig:
    """One task of ``multitask.tasks``. A task's ``data``, ``paths``, ``decoder`` and ``model`` keys override
    the top-level sections for that task (its Import, Alphabet, FeaturesSplit, LanguageModel, TuneDecoder,
    Evaluate, Export and Transcribe, run with ``--task <name>``); everything else (the features, the
    encoder, training) is the pipeline's and shared."""

    # For the reference only: the Layout fingerprints a task's keys through its view (``Config.task_view``)
    # and the Train fingerprint through ``train_key``; these say which stages of the task's that moves.
    STAGES: ClassVar[tuple[str, ...]] = ("train",)

    name: str = _opt(
        "",
        "The task's name: its --task in the DAG, its head in the checkpoints, its export's folder under "
        "paths.export_dir; letters, digits, ., _ and - (not digits only).",
        required=True,
    )
    weight: float = _opt(
        1.0,
        "The weight of the task's loss: each step's loss is the tasks' losses, each times its weight over "
        "the mean weight, averaged over the tasks in the step; validation's figures (and training.best_by) "
        "are the tasks' weighted mean.",
        minimum=0.0,
        exclusive_min=True,
    )
    targets: Literal["transcripts", "phonemes"] = _opt(
        "transcripts",
        "transcripts: the task's own transcripts (labelled as model.output says); phonemes: the transcripts "
        "of task `of`, normalised, turned into IPA by espeak-ng (stress marks dropped) in the voice of that "
        "task's data.text.language (English when it gives none): an auxiliary target on the same audio "
        "(docs/TRAINING.md).",
    )
    of: str | None = _opt(
        None,
        "With targets: phonemes: the task whose audio and transcripts it reads (it gives no data of its "
        "own).",
    )
    export: bool = _opt(
        True,
        "Whether Export writes this task's model (the shared encoder and its head); an auxiliary task is "
        "usually trained and evaluated only (false).",
        stages=(),
    )
    data: SectionOverride = _opt(
        SectionOverride(),
        "Keys of the data section for this task (train_files, dev_files, test_files, corpora, text, limits, "
        "...), in place of the top-level ones; a group of keys (text) overrides the keys it gives.",
        override="data",
        stages=("import", "alphabet", "features", "lm"),
    )
    paths: SectionOverride = _opt(
        SectionOverride(),
        "paths.alphabet and paths.export_dir for this task (export_dir default: <paths.export_dir>/<name>, "
        "one no other exported task shares; alphabet default: the top-level one, auto for a phonemes task).",
        override="paths",
        stages=("alphabet", "features", "lm"),
        override_keys=("alphabet", "export_dir"),
    )
    decoder: SectionOverride = _opt(
        SectionOverride(),
        "Keys of the decoder section for this task (its LM text, LM and beam settings), in place of the "
        "top-level ones.",
        override="decoder",
        stages=("lm", "tune", "evaluate", "export"),
    )
    model: SectionOverride = _opt(
        SectionOverride(),
        "model.output for this task (characters or bytes): its head's labels; model.objective and "
        "model.transducer: what its head is trained for (a transducer head beside CTC heads, with "
        "sharing: heads or separate).",
        override="model",
        stages=("features", "lm", "train"),
        override_keys=("output", "objective", "transducer"),
    )

    def train_key(self, model: ModelConfig) -> dict:
        """What of the task the Train fingerprint holds (its data reaches Train through its features), the
        pipeline's ``model`` section given: its objective only where it is not the pipeline's (so a config
        that sets none keeps its fingerprint)."""
        key = {"name": self.name, "weight": self.weight, "targets": self.targets, "of": self.of}
        own = self.model.apply(model)
        name = objective_name(own.objective)
        reads_transducer = name == "transducer"  # the only objective that reads model.transducer
        if name != objective_name(model.objective) or (
            reads_transducer and own.transducer != model.transducer
        ):
            key["model"] = {"objective": name}
            if reads_transducer:
                key["model"]["transducer"] = dataclasses.asdict(own.transducer)
        return key


@dataclass(frozen=True)
class MultitaskConfig:
    """Several tasks trained at once over one encoder (nabu's trainers): languages with a head each, or an
    auxiliary target such as phonemes beside the characters (docs/TRAINING.md "Multi-task training").
    Without tasks (the default) the pipeline has one task, the top-level sections'."""

    STAGES: ClassVar[tuple[str, ...]] = ("train",)

    sharing: Literal["shared", "heads", "separate"] = _opt(
        "heads",
        "What the tasks share. shared (nabu's single one-to-one): the whole network, one output layer over "
        "one alphabet (every task the same paths.alphabet and model.output; auto builds it from every task's "
        "transcripts); heads (single one-to-many): everything but the output layer, one head per task; "
        "separate (multiple one-to-one): nothing, a network per task, their losses combined.",
        when={"train": _multitask},
    )
    sampling: Literal["proportional", "round_robin"] = _opt(
        "proportional",
        "How each step draws from the tasks. proportional: a step is one batch of one task, an epoch every "
        "batch of every task once, in an order shuffled per epoch (tasks drawn in proportion to their data); "
        "round_robin: a step is one batch of every task (nabu's), an epoch as many steps as the largest "
        "task has batches, smaller tasks going round their batches again.",
        when={"train": _multitask},
    )
    tasks: tuple[TaskConfig, ...] = _opt(
        (),
        "The tasks, a list of mappings with the keys below (none: a single-task pipeline).",
        when={"train": _multitask},
    )

    @property
    def names(self) -> tuple[str, ...]:
        """The tasks' names, in order."""
        return tuple(task.name for task in self.tasks)

    def task(self, name: str) -> TaskConfig:
        """The task called ``name``; ConfigError naming the tasks there are."""
        for task in self.tasks:
            if task.name == name:
                return task
        tasks = ", ".join(self.names) or "none (no multitask)"
        raise ConfigError(f"multitask.tasks has no task {name!r}; its tasks: {tasks}")


@dataclass(frozen=True)
class Config:
    """The whole configuration; ``source`` is the file it came from."""

    paths: PathsConfig = PathsConfig()
    data: DataConfig = DataConfig()
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    early_stop: EarlyStopConfig = EarlyStopConfig()
    distribution: DistributionConfig = DistributionConfig()
    export: ExportConfig = ExportConfig()
    decoder: DecoderConfig = DecoderConfig()
    augment: AugmentConfig = AugmentConfig()
    multitask: MultitaskConfig = MultitaskConfig()
    source: str = "<defaults>"
    # The task this config is the view of (``task_view``); "" for the pipeline's own config.
    task: str = ""

    def split_files(self, split: str) -> tuple[str, ...]:
        """The CSV manifests of ``split`` (train, dev or test)."""
        return getattr(self.data, f"{split}_files")

    def has_split(self, split: str) -> bool:
        """Whether the config gives ``split`` any data: its manifests, or corpora that may hold it."""
        return bool(self.split_files(split) or self.data.corpora)

    def split_limit(self, split: str) -> int:
        """The sample cap of ``split`` (0 = all)."""
        return getattr(self.data, f"limit_{split}")

    @property
    def alphabet_auto(self) -> bool:
        """Whether the Alphabet stage builds the alphabet (``paths.alphabet: auto``, character outputs)."""
        return self.paths.alphabet == "auto" and self.model.output == "characters"

    @property
    def tasks(self) -> tuple[str, ...]:
        """The names of a multi-task config's tasks (``multitask.tasks``); () for a single-task config."""
        return self.multitask.names

    def task_view(self, name: str, source: str | None = None) -> Config:
        """Task ``name`` of a multi-task config as a single-task config: the top-level sections with the
        task's ``data``, ``paths``, ``decoder`` and ``model`` keys over them, ``task`` set to ``name``. A
        phonemes task reads the data of its ``of`` task (with its own limits over them), normalises its
        IPA transcripts with ``PHONEME_TEXT``, builds its alphabet (``paths.alphabet: auto``) unless it
        names one, and learns its LM from its training transcripts only unless it names LM text.
        ``source``: what its errors name instead of the config file (the task's entry)."""
        try:
            entry = self.multitask.task(name)
            data = entry.data.apply(self.data)
            paths = entry.paths.apply(self.paths)
            decoder = entry.decoder.apply(self.decoder)
            if entry.targets == "phonemes":
                data = entry.data.apply(self.multitask.task(entry.of).data.apply(self.data))
                data = dataclasses.replace(data, text=PHONEME_TEXT)
                if not entry.paths.given("alphabet"):
                    paths = dataclasses.replace(paths, alphabet="auto")
                if not entry.decoder.given("lm_corpus_files"):  # the top-level LM text is words, not IPA
                    decoder = dataclasses.replace(decoder, lm_corpus_files=())
        except ConfigError as error:
            raise ConfigError(f"{self.source}: {error}") from None
        return dataclasses.replace(
            self,
            data=data,
            paths=paths,
            decoder=decoder,
            model=entry.model.apply(self.model),
            task=name,
            source=source or self.source,
        )

    @property
    def phonemes_of(self) -> str | None:
        """The task whose audio a phonemes task's view reads (``multitask.tasks[].of``); None otherwise."""
        if not self.task:
            return None
        entry = self.multitask.task(self.task)
        return entry.of if entry.targets == "phonemes" else None
