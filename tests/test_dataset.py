"""Reading batches from disk: the same batches as from memory, duration caps, and decoding in a pool."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from native_client.alphabet import load_alphabet
from pipeline.batches.dataset import (
    SplitReader,
    batch_plan,
    epoch_batches,
    eval_batches,
    eval_dataset,
    train_dataset,
)
from pipeline.config_loader import load_config
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from tests.conftest import build_features


def _in_memory_batch(frames: np.ndarray, index, batch: np.ndarray):
    """The padded batch built directly from the whole split's features in memory (the old reader)."""
    lengths = index.lengths[batch]
    out = np.zeros((len(batch), lengths.max(), index.n_input), np.float32)
    for row, i in enumerate(batch):
        out[row, : lengths[row]] = frames[index.offsets[i] : index.offsets[i] + lengths[row]]
    return out


def test_disk_batches_equal_in_memory_batches_and_resume_at_the_same_batch(small_config):
    config = load_config(small_config(limit_train=40))
    build_features(config, ("train",))
    index = read_cache(Layout(config).features_cache("train"), config.features)
    with h5py.File(index.path, "r") as h5:
        frames = h5["features"][...]
    assert list(index.lengths) == sorted(index.lengths)
    reader = SplitReader(index)
    plan = batch_plan(index.lengths, 8, 2)
    # two towers: each step is two per-replica elements, in replica order
    dataset = train_dataset(reader, plan, 2, 0, 2, 0, 0, 2, 1234)
    # tf.data's autotuning is off (input_options): deleting a towers iterator waited for its model thread
    assert dataset.options().autotune.enabled is False
    elements = list(dataset)
    expected = [
        half
        for epoch in (0, 1)
        for batch in epoch_batches(plan, epoch, 1234)
        for half in (batch[:4], batch[4:])
    ]
    assert len(elements) == len(expected) == 2 * 2 * len(plan)
    for (features, lengths, labels, label_lengths, indices), batch in zip(elements, expected, strict=False):
        np.testing.assert_array_equal(indices.numpy(), batch)
        np.testing.assert_array_equal(features.numpy(), _in_memory_batch(frames, index, batch))
        np.testing.assert_array_equal(lengths.numpy(), index.lengths[batch])
        assert [list(label[:n]) for label, n in zip(labels.numpy(), label_lengths.numpy(), strict=False)] == [
            list(index.labels[i]) for i in batch
        ]
    # a resumed run (epoch 1, step 2) continues with exactly the batches an uninterrupted one would see
    resumed = [e[4].numpy() for e in train_dataset(reader, plan, 2, 0, 2, 1, 2, 2, 1234)]
    assert [list(r) for r in resumed] == [list(b) for b in expected[2 * len(plan) + 4 :]]


def test_max_batch_frames_splits_long_batches_deterministically():
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 1500, size=103).astype(np.int32)
    plain = batch_plan(lengths, 8, 2)
    capped = batch_plan(lengths, 8, 2, max_batch_frames=3000)
    assert all(len(b) == 8 for b in plain) and len(capped) > len(plain)
    for batch in capped:
        assert len(batch) % 2 == 0  # every step splits evenly over the two towers
        share = len(batch) // 2
        assert share * lengths[batch].max() <= 3000 or share == 1
    assert sorted(np.concatenate(capped)) == sorted(np.concatenate(plain))  # the same utterances, once each
    assert [list(b) for b in capped] == [list(b) for b in batch_plan(lengths, 8, 2, max_batch_frames=3000)]
    evaluation = eval_batches(lengths, 16, max_batch_frames=4000)
    assert sorted(np.concatenate(evaluation)) == list(range(103))
    assert all(len(b) * lengths[b].max() <= 4000 or len(b) == 1 for b in evaluation)


@pytest.mark.parametrize("cap", [0, 600])
def test_eval_dataset_reads_every_utterance_once(small_config, cap):
    config = load_config(small_config(limit_dev=8, limit_train=8))
    build_features(config, ("dev",))
    index = read_cache(Layout(config).features_cache("dev"), config.features)
    dataset = eval_dataset(SplitReader(index), 4, cap)
    assert dataset.options().autotune.enabled is False  # as the train batches' (input_options)
    seen = [int(i) for batch in dataset for i in batch[4].numpy()]
    assert sorted(seen) == list(range(len(index)))


def test_a_decoder_pool_gives_the_sequential_transcripts(tmp_path):
    from native_client.decoders import DecoderSpec
    from native_client.decoders.beam import BeamDecoder, BeamSettings
    from pipeline.decode.pool import DecodePool
    from tests.conftest import ALPHABET, SAMPLE

    alphabet = load_alphabet(ALPHABET)
    words = (SAMPLE / "lm_corpus.txt").read_text().split()[:3000]
    arpa = tmp_path / "lm.arpa"
    from pipeline.lm.kneser_ney import estimate, write_arpa

    write_arpa(estimate([words[i : i + 12] for i in range(0, len(words), 12)], 2), arpa)
    vocabulary = sorted(set(words))
    rng = np.random.default_rng(1)
    logits = [
        rng.normal(size=(int(n), alphabet.n_classes)).astype(np.float32) * 4 for n in rng.integers(20, 80, 10)
    ]
    settings = BeamSettings(beam_width=8)
    sequential = BeamDecoder(alphabet, arpa, settings, vocabulary)
    spec = DecoderSpec("beam", alphabet.labels, str(arpa), tuple(vocabulary), {"beam_width": 8})
    with DecodePool(spec, workers=2, chunk=3) as pool:
        assert pool.decode(iter(logits)) == [
            sequential.decode(utterance_logits) for utterance_logits in logits
        ]
        reweighted = BeamDecoder(
            alphabet, arpa, BeamSettings(beam_width=8, lm_alpha=0.3, lm_beta=4.0), vocabulary
        )
        assert pool.decode(logits, weights=(0.3, 4.0)) == [
            reweighted.decode(utterance_logits) for utterance_logits in logits
        ]
        assert sequential.reweighted(0.3, 4.0).decode(logits[0]) == reweighted.decode(logits[0])
