"""``model.objective: transducer`` through the one core (issue 47): Train trains and validates it and keeps
its predictor and joiner in the checkpoint; its keys move no other config's fingerprint; preflight refuses
TuneDecoder, which has no language model to tune (the export and client: test_transducer_export.py)."""

import json
from types import SimpleNamespace

import luigi
import numpy as np
import pytest
import tensorflow as tf

from pipeline.batches.buckets import ShapeGrid
from pipeline.batches.dataset import batch_plan, eval_batches
from pipeline.batches.joint_cap import JointCap
from pipeline.config import ConfigError
from pipeline.config_loader import load_config
from pipeline.evaluation.run import run_split
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from pipeline.model import build_model
from pipeline.model.checkpoints import CheckpointMismatchError, load_trained_model, warm_start
from pipeline.model.labels import model_alphabet
from pipeline.model.objectives import model_objective
from pipeline.model.weights import named_weights
from pipeline.train.checkpointing import TrainingError
from pipeline.train.joint_plans import planned
from tasks import Evaluate
from tasks.preflight import PreflightError, check_objective_reach

TINY_CONFORMER = """
model:
  architecture: conformer
  objective: transducer
  conformer: {d_model: 32, heads: 2, layers: 1, conv_kernel: 5, subsampling: 2, subsampling_channels: 8,
              ff_mult: 2}
  transducer: {predictor_dim: 16, predictor_groups: 4, joint_dim: 24}
"""


def test_train_and_evaluate_take_a_transducer_and_its_checkpoint_holds_the_head(
    small_config, tasks_in_process
):
    """The dev figures Train reports are those of the checkpoint read back: the predictor and joiner were
    saved with the encoder (a head made afresh would score otherwise). Evaluate gives greedy figures
    (chunked and full context) and none with the LM, which a transducer does not read; no LM is built."""
    path = small_config(extra=TINY_CONFORMER, limit_train=12, limit_dev=4, limit_test=4)
    config = load_config(path)
    assert luigi.build([Evaluate(config=str(path))], local_scheduler=True)
    layout = Layout(config)
    evaluation = json.loads((layout.evaluate_dir / "evaluation.json").read_text())
    assert evaluation["decoder"] == "greedy" and evaluation.get("wer_lm") is None
    assert evaluation["cer_full_context"] is not None
    assert not layout.lm.root.exists()
    dev = read_cache(layout.features_cache("dev"), config.features)
    alphabet = model_alphabet(config, layout.alphabet)
    model = load_trained_model(config, layout.train_run.best, dev.n_input, alphabet.n_classes)
    names = named_weights(model)
    assert {"transducer.predictor.embedding.embeddings", "transducer.output.kernel"} <= set(names)
    assert tuple(names["output.kernel"].shape) == (32, 24)  # the encoder's projection to joint_dim
    results = run_split(model, dev, alphabet, 4)
    best = json.loads(layout.train_run.report.read_text())["best_dev"]
    assert best["dev_loss"] == pytest.approx(float(np.mean([r.loss for r in results])), rel=1e-4)
    errors = sum(r.char_errors for r in results) / sum(r.chars for r in results)
    assert best["cer"] == pytest.approx(errors, abs=1e-6)


def test_the_transducer_s_keys_move_no_ctc_fingerprint_and_move_its_own(small_config):
    plain = Layout(load_config(small_config("plain.yaml")))
    written = Layout(
        load_config(small_config("written.yaml", extra="model:\n  transducer: {joint_dim: 64}\n"))
    )
    assert written.train_fingerprint == plain.train_fingerprint
    one = Layout(load_config(small_config("one.yaml", extra=TINY_CONFORMER)))
    wider = TINY_CONFORMER.replace("joint_dim: 24", "joint_dim: 48")
    other = Layout(load_config(small_config("other.yaml", extra=wider)))
    assert one.train_fingerprint != other.train_fingerprint
    assert one.features_cache("train") == other.features_cache("train")
    # its too-short rule is not CTC's (one frame is enough): caches of its own
    ctc = Layout(load_config(small_config("ctc.yaml", extra=TINY_CONFORMER.replace("transducer\n", "ctc\n"))))
    assert one.features_cache("train") != ctc.features_cache("train")
    assert model_objective("transducer").min_outputs([3, 3, 3, 3]) == 1


def test_what_a_transducer_cannot_do_is_refused_in_one_line(small_config):
    config = load_config(small_config(extra=TINY_CONFORMER))
    for task in ("Train", "FeaturesSplit", "Alphabet", "Evaluate", "Export", "Transcribe"):
        check_objective_reach(config, task)
    with pytest.raises(PreflightError, match=r"model\.objective: transducer: TuneDecoder tunes a language"):
        check_objective_reach(config, "TuneDecoder")
    with pytest.raises(ConfigError, match=r"predictor_groups: 5 does not divide predictor_dim 16"):
        load_config(small_config("groups.yaml", extra=TINY_CONFORMER.replace("groups: 4", "groups: 5")))
    # a transducer task beside a CTC one (tests/test_multitask_transducer.py trains them): TuneDecoder
    # tunes the CTC task's LM
    multitask = (
        TINY_CONFORMER + "multitask:\n  tasks:\n    - {name: a}\n    - {name: b, model: {objective: ctc}}\n"
    )
    mixed = load_config(small_config("multi.yaml", extra=multitask))
    assert [mixed.task_view(task).model.objective for task in mixed.tasks] == ["transducer", "ctc"]
    check_objective_reach(mixed, "TuneDecoder")


def _cap(max_mib: float, lengths, label_lengths, grid=None) -> JointCap:
    """A family of stride 2, 29 classes, a joiner 16 wide, float32: (3 x 29 + 4 x 16) x 4 B a pair."""
    return JointCap(np.array(lengths), np.array(label_lengths), lambda f: (f + 1) // 2, 29, max_mib, grid, 16)


def test_the_batch_plans_keep_a_tower_s_joint_scores_under_the_cap():
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 400, 64)
    label_lengths = lengths // 3
    each = 100 * 100 * (3 * 29 + 4 * 16) * 4 / 2**20  # MiB of one 200-frame, 99-label utterance
    assert _cap(1.0, lengths, label_lengths).mib_each(200, 99) == pytest.approx(each)
    cap = _cap(6 * each, lengths, label_lengths)
    for towers in (1, 2):
        plan = batch_plan(lengths, 16 * towers, towers, joint=cap)
        assert sorted(np.concatenate(plan)) == sorted(range(64))
        for batch in plan:
            frames, labels = int(lengths[batch].max()), int(label_lengths[batch].max())
            assert len(batch) % towers == 0
            assert len(batch) // towers * cap.mib_each(frames, labels) <= 6 * each
        assert len(plan) > 64 * towers // (16 * towers)  # cut: the cap binds
    for batch in eval_batches(lengths, 16, joint=cap):
        assert (
            len(batch) * cap.mib_each(int(lengths[batch].max()), int(label_lengths[batch].max())) <= 6 * each
        )
    grid = ShapeGrid(lengths, label_lengths, 1.2)
    gridded = _cap(6 * each, lengths, label_lengths, grid)
    for batch in batch_plan(lengths, 16, 1, grid=grid, joint=gridded):
        longest = int(lengths[batch].max())
        assert len(batch) * gridded.mib_each(grid.frames(longest), grid.labels(longest)) <= 6 * each


def test_an_utterance_over_the_cap_alone_is_refused_naming_its_audio():
    lengths, label_lengths = np.array([100, 120, 900]), np.array([30, 40, 400])
    cap = _cap(100.0, lengths, label_lengths)  # 450 x 401 pairs of 604 B: 104 MiB
    index = SimpleNamespace(paths=["a.wav", "b.wav", "long.wav"])
    with pytest.raises(
        TrainingError,
        match=r"^long\.wav: it alone needs 104 MiB for the joiner \(450 frames x 401 label positions\), over",
    ):
        planned(index, batch_plan, lengths, 3, 1, 0, None, cap)
    assert planned(index, batch_plan, lengths[:2], 2, 1, 0, None, cap)


def test_a_transducer_starts_from_a_ctc_model_s_encoder(small_config, tmp_path):
    """``init_from`` a CTC run with ``drop_source_layers: 2``: the encoder is copied, its output layer
    (the CTC scores, the joiner's projection here) and the head (the last layer, absent from the source)
    start afresh; with 1 the output layer's shape is refused in one line."""
    ctc_config = load_config(small_config("ctc.yaml", extra=TINY_CONFORMER.replace("transducer\n", "ctc\n")))
    source = build_model(ctc_config.model, 26, 29)
    prefix = tf.train.Checkpoint(weights=named_weights(source)).write(str(tmp_path / "ctc" / "ckpt"))
    model = build_model(load_config(small_config(extra=TINY_CONFORMER)).model, 26, 29)
    names = named_weights(model)
    fresh = {name: variable.numpy() for name, variable in names.items()}
    copied = warm_start(model, prefix, 2)
    assert set(copied) == {name for name in names if not name.startswith(("transducer.", "output."))}
    for name, variable in names.items():
        want = named_weights(source)[name].numpy() if name in copied else fresh[name]
        np.testing.assert_array_equal(variable.numpy(), want)
    with pytest.raises(CheckpointMismatchError, match=r"weight output\.kernel has shape \[32, 29\]"):
        warm_start(model, prefix, 1)


def test_the_step_gives_the_predictor_s_embedding_a_dense_gradient(small_config):
    """The embedding's gradient comes from TensorFlow as a slice per label, repeats included; Keras' Adam
    squares slices apart, so the step sums them first: the optimizer sees the one dense gradient a window
    of accumulated batches also gives (``test_accumulate.py``, the transducer's batch of 16)."""
    import keras

    from pipeline.model.heads import OneTask
    from pipeline.train.step import task_gradients

    config = load_config(small_config(extra=TINY_CONFORMER))
    model = build_model(config.model, 26, 29)
    view = OneTask(model)
    features = tf.constant(np.random.default_rng(3).standard_normal((2, 40, 26)).astype(np.float32))
    batch = (features, tf.constant([40, 31]), tf.constant([[5, 5, 5], [5, 7, 0]]), tf.constant([3, 2]), None)
    step = task_gradients(view, (0,), [28], keras.optimizers.Adam(), config.training)
    gradients = step((batch,), tf.constant([1.0]))[3]
    names = [v.path for v in view.task_variables((0,))]
    embedding = gradients[next(i for i, n in enumerate(names) if n.endswith("embedding/embeddings"))]
    assert all(isinstance(g, tf.Tensor) for g in gradients)
    assert embedding.shape == (29, 16) and float(tf.reduce_max(tf.abs(embedding[5]))) > 0
