"""The transducer's predictor and joiner (issue 47): their training and decoding forms agree, and a small
transducer trained with ``rnnt_loss`` learns a toy task that the client's searches then decode."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from native_client.transducer_search import GreedySearch, ModifiedBeamSearch
from pipeline.config import TransducerConfig
from pipeline.model.objectives.transducer import rnnt_loss
from pipeline.model.transducer_net import StatelessPredictor, TransducerHead

BLANK = 4  # labels 0-3, the blank last


def _predictor(context_size: int, groups: int = 2, dim: int = 8) -> StatelessPredictor:
    predictor = StatelessPredictor(BLANK + 1, BLANK, dim, context_size, groups, seed=1)
    predictor.build((None, context_size))
    return predictor


@pytest.mark.parametrize("context_size", [1, 2, 3])
def test_the_predictor_over_a_transcript_is_the_predictor_over_each_context(context_size):
    predictor = _predictor(context_size)
    labels = np.array([[0, 3, 3, 1, 2], [2, 2, 0, 1, 1]], np.int32)
    whole = predictor.over_transcripts(labels).numpy()
    assert whole.shape == (2, 6, 8)
    for u in range(6):
        contexts = [([BLANK] * context_size + list(row[:u]))[-context_size:] for row in labels]
        each = predictor.over_contexts(np.array(contexts, np.int32)).numpy()
        np.testing.assert_allclose(whole[:, u], each, rtol=1e-6, atol=1e-6)
    assert not whole[:, 0].any()  # before any label: the blank's zero embedding


def _head(context_size: int = 2, joint_dim: int = 16, max_symbols: int = 4) -> TransducerHead:
    settings = TransducerConfig(
        context_size=context_size,
        predictor_dim=8,
        predictor_groups=2,
        joint_dim=joint_dim,
        max_symbols=max_symbols,
    )
    head = TransducerHead(settings, BLANK + 1, BLANK, seed=3)
    head.build()
    return head


def test_the_joiner_scores_every_pair_as_its_decoding_form_does():
    head = _head(joint_dim=5)
    rng = np.random.default_rng(0)
    frames = rng.normal(size=(2, 4, 5)).astype(np.float32)
    labels = np.array([[1, 2], [3, 0]], np.int32)
    logits = head.joint(frames, labels).numpy()
    assert logits.shape == (2, 4, 3, BLANK + 1)
    for t, u in [(0, 0), (3, 2), (1, 1)]:
        context = ([BLANK, BLANK] + list(labels[1, :u]))[-2:]
        one = head.join(frames[1, t][None], head.predict(np.array([context], np.int32))).numpy()[0]
        np.testing.assert_allclose(logits[1, t, u], one, rtol=1e-5, atol=1e-5)


def test_settings_the_predictor_cannot_take_are_refused():
    with pytest.raises(ValueError, match="context_size"):
        StatelessPredictor(5, 4, 8, 0, 2, seed=1)
    with pytest.raises(ValueError, match="multiple"):
        StatelessPredictor(5, 4, 8, 2, 3, seed=1)


class _Parts:
    """The trained head as the client's searches call it."""

    context_size = 2
    blank = BLANK

    def __init__(self, head):
        self.head = head

    def predict(self, contexts):
        return self.head.predict(contexts).numpy()

    def join(self, frame, predicted):
        return self.head.join(frame[None], predicted).numpy()


def _toy_batch(rng, batch: int, frames: int = 8):
    """Frames of silence (feature 4) and of labels 0-3 (one-hot); the transcript is the labels in order.
    Every utterance has 1 to 4 labels, each one frame with silence between, and no label twice in a row: an
    encoder that sees one frame at a time cannot tell a repeat from the label it has just emitted."""
    features = np.zeros((batch, frames, 5), np.float32)
    labels = np.zeros((batch, 4), np.int32)
    lengths = np.zeros(batch, np.int32)
    for b in range(batch):
        count = rng.integers(1, 5)
        spoken = np.cumsum(rng.integers(1, 4, count)) % 4  # each differs from the one before
        where = np.sort(rng.choice(np.arange(0, frames, 2), count, replace=False))
        features[b, :, 4] = 1.0
        for label, at in zip(spoken, where, strict=True):
            features[b, at] = np.eye(5)[label]
        labels[b, :count], lengths[b] = spoken, count
    return features, labels, lengths


def test_a_small_transducer_learns_a_toy_task_and_every_search_decodes_it():
    """The encoder (one Dense: the joiner's encoder projection), the head and rnnt_loss learn the toy task;
    the client's greedy and beam searches and the head's batched greedy search (the dev figures) decode it,
    the batched one label for label as the client's greedy search."""
    keras.utils.set_random_seed(0)
    encoder = keras.Sequential([keras.Input((None, 5)), keras.layers.Dense(16, activation="tanh")])
    head = _head(joint_dim=16)
    variables = encoder.trainable_variables + head.trainable_variables
    optimizer = keras.optimizers.Adam(0.02)
    rng = np.random.default_rng(1)

    @tf.function
    def step(features, labels, label_lengths):
        with tf.GradientTape() as tape:
            logits = head.joint(encoder(features), labels)
            frames = tf.fill([tf.shape(features)[0]], tf.shape(features)[1])
            loss = tf.reduce_mean(rnnt_loss(logits, labels, frames, label_lengths, BLANK))
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    losses = [float(step(*_toy_batch(rng, 32))) for _ in range(300)]
    assert losses[-1] < 0.1 * losses[0]
    parts = _Parts(head)
    features, labels, lengths = _toy_batch(np.random.default_rng(2), 20)
    frame_counts = np.full(20, 8, np.int32)
    frame_counts[0] = 5  # the batched search stops at each utterance's length
    encoded = encoder(features).numpy()
    batched = head.greedy(encoded, frame_counts, max_symbols=4).numpy()
    right = {"greedy": 0, "beam": 0}
    for b in range(20):
        frames = encoded[b, : frame_counts[b]]
        greedy, beam = GreedySearch(parts, max_symbols=4), ModifiedBeamSearch(parts)
        greedy.advance(frames)
        beam.advance(frames)
        assert tuple(batched[b][batched[b] >= 0]) == greedy.hypotheses()[0].labels
        if b:
            want = tuple(labels[b, : lengths[b]])
            right["greedy"] += greedy.hypotheses()[0].labels == want
            right["beam"] += beam.hypotheses()[0].labels == want
    assert right["greedy"] >= 17 and right["beam"] >= 17, right
