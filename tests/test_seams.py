"""Extension points: a front end and a model family of a user's own (tests/plugins/), and the built-in
logfbank front end, each through the DAG and the client without editing a project file."""

from __future__ import annotations

import json
import subprocess
import sys

import luigi
import numpy as np
import pytest

from native_client import ExportError, Model
from native_client.audio import load_for_model
from pipeline.config_loader import load_config
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from pipeline.model.checkpoints import load_trained_model
from pipeline.model.normalization import normalized
from pipeline.model.objectives import model_objective
from tasks import Evaluate, Export
from tests.conftest import ROOT, SAMPLE

pytestmark = pytest.mark.usefixtures("tasks_in_process")
CLIP = SAMPLE / "test" / "00002.flac"


def _client_logits_equal_the_checkpoint(config, export):
    """The client (its front end chosen from the export's metadata) gives the checkpoint's logits."""
    model = Model(export, plugins=(config.features.type,))
    samples = load_for_model(CLIP, 16000)
    frames = model.metadata.features.frames(samples)
    checkpoint = load_trained_model(config, Layout(config).train_run.best, frames.shape[1], 29)
    np.testing.assert_allclose(
        model.logits(samples), checkpoint(normalized(checkpoint, frames[None])).numpy()[0], atol=1e-4
    )
    assert isinstance(model.transcribe_file(CLIP).text, str)
    return model


def test_a_front_end_and_a_model_family_of_ones_own_run_through_the_dag_and_the_client(small_config):
    path = small_config(
        limit_train=12,
        limit_dev=4,
        limit_test=4,
        extra="""
            features:
              type: tests.plugins.band_energies
              bands: 10
              step_ms: 20
            model:
              architecture: tests.plugins.simple_rnn_family
              simple_rnn: {units: 24}
            training:
              epochs: 1
        """,
    )
    assert luigi.build([Export(config=str(path))], local_scheduler=True)
    config = load_config(path)
    export = Layout(config).find_export().root
    metadata = json.loads((export / "metadata.json").read_text())
    assert metadata["architecture"] == "tests.plugins.simple_rnn_family"
    features = metadata["features"]
    assert metadata["normalization"] == "global"  # the sample's, in the model of a family of one's own
    assert features == {
        "type": "tests.plugins.band_energies",
        "bands": 10,
        "window_ms": 25.0,
        "step_ms": 20.0,
        "sample_rate": 16000,
        "normalize": False,
    }
    assert metadata["tensors"]["state"] == [
        {"input": "previous_state", "output": "new_state", "shape": [1, 24]}
    ]
    model = _client_logits_equal_the_checkpoint(config, export)
    assert model.metadata.features.frontend.feature_size == 10
    assert model.metadata.features.seconds_per_frame == pytest.approx(0.02)
    # an export does not choose code to import: a front end of someone's own must be allowed by name
    with pytest.raises(
        ExportError, match=r"features\.type: 'tests\.plugins\.band_energies' is a module of someone's own"
    ):
        Model(export)
    refused = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(CLIP)],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "--allow-plugin tests.plugins.band_energies" in refused.stderr
    allowed = subprocess.run(
        [
            sys.executable,
            "-m",
            "native_client",
            "--model",
            str(export),
            "--audio",
            str(CLIP),
            "--allow-plugin",
            "tests.plugins.band_energies",
        ],
        capture_output=True,
        text=True,
    )
    assert allowed.returncode == 0, allowed.stderr


def test_a_family_that_subsamples_time_runs_through_the_dag_and_the_client(small_config):
    """A family of one's own emitting one label per 4 frames, with a streaming form over chunks of frames:
    the CTC loss, the too-short check, the export and the client take its stride, input and state from the
    family and the metadata (no project file names it)."""
    from pipeline.model import model_family
    from tasks import FeaturesSplit
    from tests.plugins.subsample4_family import FAMILY

    path = small_config(
        limit_train=12,
        limit_dev=4,
        limit_test=4,
        extra="""
            features:
              type: mfcc
              normalize: false
            model:
              architecture: tests.plugins.subsample4_family
              subsample4: {units: 24}
            training:
              epochs: 1
        """,
    )
    config = load_config(path)
    deepspeech = load_config(small_config("ds.yaml", extra="features:\n  type: mfcc\n  normalize: false\n"))
    # the too-short check counts labels at the family's rate, so the caches are not DeepSpeech's
    assert Layout(config).features_cache("train") != Layout(deepspeech).features_cache("train")
    assert FAMILY.min_feature_frames(config.model, 3) == 9 and FAMILY.output_lengths(config.model, 9) == 3
    assert model_family("deepspeech").min_feature_frames(deepspeech.model, 3) == 3
    assert luigi.build(
        [
            FeaturesSplit(config=str(path), split="train"),
            Evaluate(config=str(path)),
            Export(config=str(path)),
        ],
        local_scheduler=True,
    )
    export = Layout(config).find_export().root
    metadata = json.loads((export / "metadata.json").read_text())
    assert metadata["stride"] == 4 and metadata["n_context"] == 0
    assert metadata["streaming"] == {
        "input": "frames",
        "chunk": 16,
        "context": 0,
        "lookahead": 0,
        "lookback": 0,
    }
    assert metadata["tensors"]["state"] == [
        {"input": "previous_state", "output": "new_state", "shape": [1, 24]}
    ]
    for backend in ("tflite", "saved_model", "frozen_graph"):
        model = Model(export, backend=backend)
        samples = load_for_model(CLIP, 16000)
        frames = model.metadata.features.frames(samples)
        logits = model.logits(samples)
        assert len(logits) == -(-len(frames) // 4)
        checkpoint = load_trained_model(config, Layout(config).train_run.best, frames.shape[1], 29)
        np.testing.assert_allclose(
            logits, checkpoint(normalized(checkpoint, frames[None])).numpy()[0], atol=1e-4
        )
        stream = model.create_stream()  # fed in blocks that cut chunks anywhere: the same labels
        for start in range(0, len(samples), 1234):
            stream.feed_audio(samples[start : start + 1234])
        np.testing.assert_allclose(stream.flush(), logits, atol=1e-4)
    assert model.metadata.seconds_per_label == pytest.approx(0.04)  # 10 ms frames, 4 per label
    found = model.transcribe_file(CLIP)
    assert all(word.duration >= 0.04 - 1e-9 for word in found.candidates[0].words)
    cli = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(CLIP), "--json"],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr


def test_a_front_end_of_ones_own_must_be_a_front_end(small_config):
    from pipeline.config import ConfigError

    path = small_config(extra="features:\n  type: tests.plugins.simple_rnn_family\n")
    with pytest.raises(
        ConfigError, match=r"features\.type: module 'tests\.plugins\.simple_rnn_family' defines no FRONTEND"
    ):
        load_config(path)


def test_logfbank_trains_through_the_whole_dag_and_the_client_uses_it(small_config):
    path = small_config(
        limit_train=12,
        limit_dev=4,
        limit_test=4,
        extra="features:\n  type: logfbank\n  nfilt: 30\ntraining:\n  epochs: 1\n",
    )
    assert luigi.build([Evaluate(config=str(path)), Export(config=str(path))], local_scheduler=True)
    config = load_config(path)
    features_file = Layout(config).features_cache("train")
    mfcc = Layout(load_config(small_config("mfcc.yaml", limit_train=12, limit_dev=4, limit_test=4)))
    assert features_file != mfcc.features_cache("train")  # another front end, another cache
    export = Layout(config).find_export().root
    model = _client_logits_equal_the_checkpoint(config, export)
    assert model.metadata.features.to_dict()["type"] == "logfbank"
    assert model.metadata.features.frontend.feature_size == 30


def test_every_stage_is_declared_once_and_its_task_found_beside_it():
    """The DAG is the stages' own declarations (``STAGE`` in ``pipeline/stages/<module>.py``), found
    without a list; each stage's task is the class of ``tasks/<module>.py`` the declaration names, and the
    command line and ``make rerun`` know every one from the same declarations."""
    import tasks
    from pipeline.dag import stages
    from tasks.base import pipeline_tasks, task_class

    declared = stages()
    built_in = "import align clean phonemes alphabet features train lm tune evaluate export transcribe"
    assert set(declared) == set(built_in.split())
    for name, stage in declared.items():
        cls = task_class(name)
        assert (cls.__name__, cls.__module__, cls.stage) == (stage.task, f"tasks.{stage.module}", name)
        assert getattr(tasks, stage.task) is cls
    assert set(pipeline_tasks()) == {
        *(s.task for s in declared.values()),
        "Features",
        "Imports",
        "Alignments",
    }


def test_the_stage_modules_declare_the_dag_without_loading_tensorflow():
    """Reading the DAG (every fingerprint, every Luigi requires()) imports each stage's module: none of
    them may load TensorFlow or Optuna at import (their functions do), or every task, the scheduler side
    included, would pay for it."""
    code = (
        "import sys\n"
        "import tasks\n"
        "from pipeline.dag import stages\n"
        "assert len(stages()) == 12\n"
        "print(sorted(m for m in ('tensorflow', 'optuna', 'keras') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]", done.stdout


def test_a_task_that_does_not_match_its_stages_declaration_is_named():
    """A stage whose task module has no task of the declared name is a TypeError naming the module."""
    import dataclasses

    from pipeline.dag import stage
    from tasks.base import find_task

    renamed = dataclasses.replace(stage("alphabet"), task="Letters")
    with pytest.raises(
        TypeError, match=r"tasks/alphabet.py: stage 'alphabet' is run by one ConfigTask named Letters"
    ):
        find_task(renamed)
    moved = dataclasses.replace(stage("alphabet"), module="evaluate")
    with pytest.raises(TypeError, match=r"tasks/evaluate.py: .* \(found: none\)"):
        find_task(moved)


def test_rerun_runs_the_roots_the_dag_declares_and_they_reach_every_stage(small_config):
    """``make rerun`` takes its roots from ``pipeline.dag``: the stages a config's pipeline has that no other
    one reads. From them every stage of that pipeline is reached (so a removed output is rebuilt), and a
    stage the config does not run (TuneDecoder without decoder.tune) is not run."""
    from pipeline.dag import stages
    from tasks.rerun import dag, dag_roots

    plain = str(small_config("plain.yaml"))
    full = str(small_config("full.yaml", extra="decoder:\n  tune: true\npaths:\n  alphabet: auto\n"))
    assert [type(t).__name__ for t in dag_roots(plain, {"audio": None})] == ["Evaluate", "Export"]
    assert [type(t).__name__ for t in dag_roots(plain, {"audio": "a.wav"})] == ["Evaluate", "Transcribe"]
    assert "TuneDecoder" not in {type(t).__name__ for t in dag(dag_roots(plain, {"audio": None})).values()}
    reached = {type(t).__name__ for t in dag(dag_roots(full, {"audio": "a.wav"})).values()}
    # the sample has no corpora (nothing to import or align), no multitask phonemes task, no data.clean
    assert reached == {stage.task for stage in stages().values()} - {"Import", "Align", "Phonemes", "Clean"}


def test_keys_that_change_no_result_in_a_config_move_no_fingerprint():
    from pipeline.config_loader import config_from_dict

    def fingerprints(**sections):
        layout = Layout(config_from_dict({"decoder": {"tune": True, "lm_builder": "python"}, **sections}))
        return {
            stage: layout.fingerprint(stage, **params)
            for stage, params in [
                ("features", {"split": "train"}),
                ("train", {}),
                ("lm", {}),
                ("tune", {}),
                ("evaluate", {}),
                ("export", {}),
            ]
        }

    base = fingerprints()
    # without augmentation its seed and mask sizes matter to nothing; the Python LM builder ignores
    # KenLM's settings; with lexicon decoding the character LM's order is unused
    for sections in (
        {"augment": {"seed": 7, "freq_mask_max": 9, "noise_snr_db": [5.0, 6.0]}},
        {"decoder": {"tune": True, "lm_builder": "python", "lm_quantize_bits": 4, "char_lm_order": 4}},
        {"training": {"checkpoint_secs": 5}, "features": {"workers": 1}},
        {"training": {"checkpoint_steps": 10, "hooks": ["tests.plugins.step_barrier"]}},
    ):
        assert fingerprints(**sections) == base, sections
    moved = fingerprints(augment={"freq_masks": 1})
    assert moved["features"] == base["features"] and moved["train"] != base["train"]
    lexicon_free = fingerprints(decoder={"tune": True, "lm_builder": "python", "lexicon": False})
    assert lexicon_free["train"] == base["train"] and lexicon_free["lm"] != base["lm"]


def test_a_warm_start_fingerprint_follows_its_weights_not_the_rest_of_the_folder(tmp_path):
    from pipeline.config_loader import config_from_dict

    run = tmp_path / "run" / "best"
    run.mkdir(parents=True)
    (run / "best-3.index").write_bytes(b"index")
    (run / "best-3.data-00000-of-00001").write_bytes(b"weights")
    (run / "checkpoint").write_text('model_checkpoint_path: "best-3"\n')

    def train_fp():
        return Layout(config_from_dict({"training": {"init_from": str(tmp_path / "run")}})).train_fingerprint

    first = train_fp()
    (tmp_path / "run" / "summaries").mkdir()
    (tmp_path / "run" / "summaries" / "events").write_bytes(b"more")
    assert train_fp() == first
    (run / "best-3.data-00000-of-00001").write_bytes(b"other weights")
    assert train_fp() != first


def test_an_objective_of_ones_own_trains_evaluates_and_exports_through_the_dag(small_config):
    """``model.objective`` names a module of one's own (tests/plugins/smoothed_ctc_objective.py): Train
    minimises its loss, validation and Evaluate report it, the export and the client run the model; it
    needs of the data what CTC needs, so the feature caches are CTC's own, and only Train re-runs."""
    from pipeline.config import ConfigError
    from pipeline.evaluation.run import run_split
    from pipeline.model.labels import model_alphabet
    from tests.plugins.smoothed_ctc_objective import OBJECTIVE

    limits = {"limit_train": 12, "limit_dev": 4, "limit_test": 4}
    own = "model:\n  objective: tests.plugins.smoothed_ctc_objective\ntraining:\n  epochs: 1\n"
    path = small_config(extra=own, **limits)
    ctc = Layout(load_config(small_config("ctc.yaml", extra="training:\n  epochs: 1\n", **limits)))
    config = load_config(path)
    layout = Layout(config)
    assert layout.features_cache("train") == ctc.features_cache("train")
    assert layout.train_fingerprint != ctc.train_fingerprint
    named = Layout(load_config(small_config("named.yaml", extra="model:\n  objective: ctc\n", **limits)))
    assert (
        named.train_fingerprint == Layout(load_config(small_config("plain.yaml", **limits))).train_fingerprint
    )
    assert luigi.build([Evaluate(config=str(path)), Export(config=str(path))], local_scheduler=True)

    test = read_cache(layout.features_cache("test"), config.features)
    model = load_trained_model(config, layout.train_run.best, test.n_input, 29)
    alphabet = model_alphabet(config, layout.alphabet)
    smoothed = run_split(model, test, alphabet, 4)
    plain = run_split(model, test, alphabet, 4, forward=_plain_ctc_forward(model, alphabet.blank_index))
    evaluation = json.loads((layout.evaluate_dir / "evaluation.json").read_text())
    mean = float(np.mean([r.loss for r in smoothed]))
    assert evaluation["loss"] == pytest.approx(mean, rel=1e-4)
    assert abs(mean - float(np.mean([r.loss for r in plain]))) > 0.01 * mean  # not CTC's loss
    dev = run_split(model, read_cache(layout.features_cache("dev"), config.features), alphabet, 4)
    validated = json.loads(layout.train_run.report.read_text())["best_dev"]["dev_loss"]
    assert validated == pytest.approx(float(np.mean([r.loss for r in dev])), rel=1e-4)
    assert OBJECTIVE.min_outputs([1, 1, 2]) == 4
    exported = Model(layout.find_export().root)
    assert isinstance(exported.transcribe_file(CLIP).text, str)
    with pytest.raises(ConfigError, match=r"model\.objective: no objective 'transducr' \(a module of"):
        load_config(small_config("typo.yaml", extra="model:\n  objective: transducr\n"))
    with pytest.raises(
        ConfigError, match=r"model\.objective: module 'tests\.plugins\.band_energies' defines no OBJ"
    ):
        load_config(small_config("none.yaml", extra="model:\n  objective: tests.plugins.band_energies\n"))


def _plain_ctc_forward(model, blank_index: int):
    """The model's forward pass scored by plain CTC."""
    from pipeline.evaluation.run import make_forward
    from pipeline.model.normalization import normalized
    from pipeline.model.objectives import model_objective

    def run(features, lengths):
        return model(normalized(model, features), training=False), lengths

    return make_forward(run, model_objective("ctc"), blank_index)


def test_the_training_step_minimises_the_configs_objective(small_config):
    """The step's loss and gradients are the objective's (``model.objective``), not CTC's."""
    import keras
    import tensorflow as tf

    from pipeline.model import build_model
    from pipeline.model.heads import OneTask
    from pipeline.train.step import task_gradients
    from tests.plugins.smoothed_ctc_objective import OBJECTIVE

    config = load_config(small_config(extra="model:\n  objective: tests.plugins.smoothed_ctc_objective\n"))
    view = OneTask(build_model(config.model, 26, 29))
    assert view.objective is OBJECTIVE
    features = tf.constant(np.random.default_rng(5).standard_normal((2, 40, 26)).astype(np.float32))
    lengths, labels, label_lengths = (
        tf.constant([40, 31]),
        tf.constant([[1, 2, 3], [4, 5, 0]]),
        tf.constant([3, 2]),
    )
    step = task_gradients(view, (0,), [28], keras.optimizers.Adam(), config.training)
    sums = step(((features, lengths, labels, label_lengths, None),), tf.constant([1.0]))[0]
    logits, output_lengths = view.forward(0, features, lengths, training=False)
    scored = {
        name: float(tf.reduce_sum(objective.loss(labels, label_lengths, logits, output_lengths, 28, False)))
        for name, objective in (("own", OBJECTIVE), ("ctc", model_objective("ctc")))
    }
    assert float(sums[0]) == pytest.approx(scored["own"], rel=1e-5)
    assert abs(scored["own"] - scored["ctc"]) > 0.01 * scored["ctc"]


def test_an_objective_shares_ctcs_feature_caches_only_with_ctcs_too_short_rule():
    """The Features fingerprint holds the too-short rule of the class that defines ``min_outputs``: the
    label-smoothed CTC inherits CTC's (and shares its caches); an objective with its own ``min_outputs``
    has a rule of its own though it subclasses CTC, unless it declares one; no ``name`` is needed."""
    from pipeline.model.objectives.ctc import CTC
    from tests.plugins.smoothed_ctc_objective import OBJECTIVE

    class OneFramePerTranscript(CTC):
        def min_outputs(self, labels) -> int:
            return 1

    class Declared(OneFramePerTranscript):
        too_short_rule = "one frame"

    assert model_objective("ctc").data_rule == OBJECTIVE.data_rule == "ctc"
    assert OneFramePerTranscript().data_rule.endswith("OneFramePerTranscript")
    assert Declared().data_rule == OneFramePerTranscript().data_rule  # declared below min_outputs' class

    class Own(Declared):
        too_short_rule = "one frame"

        def min_outputs(self, labels) -> int:
            return 1

    assert Own().data_rule == "one frame"
