"""The transducer objective (``model.objective: transducer``, issue 47): RNN-T over a joiner's scores of
every pair of an encoder frame and a count of labels emitted so far.

The family network is trained as it is, its output layer ``model.transducer.joint_dim`` wide: the joiner's
encoder projection. The objective's head (``pipeline/model/transducer_net.py``: icefall's stateless
predictor and the joiner) comes after it. The loss is ``rnnt_loss``, exact and in log space
(``pipeline/model/rnnt.py``, imported when a loss is computed, so that this module imports without
TensorFlow as an objective module must). The dev figures in training come from a batched greedy search.

A transducer has none of CTC's too-short rule: it emits any number of labels on one frame, so an utterance
needs one output frame whatever its transcript. What it emits is not label scores per frame: the export
holds the predictor and joiner as signatures of their own (``pipeline.export.inference_graph``) and the
client searches with them (``native_client/transducer_decoder.py``); the LM decoders do not read it, so
no LM or TuneDecoder runs for it.
"""

from __future__ import annotations

from pipeline.model.objective import TRANSDUCER_OUTPUT, Objective


def rnnt_loss(logits, labels, logit_lengths, label_lengths, blank: int):
    """Per-utterance negative log-likelihood ``[batch]`` of the padded ``labels`` ``[batch, max_labels]``
    under the joiner's unnormalised outputs ``logits`` ``[batch, frames, max_labels + 1, classes]``
    (``logit_lengths`` frames and ``label_lengths`` labels each; ``blank`` any class index), exact, in log
    space; padding past each utterance's lengths gets zero gradient. Runs under XLA and on any device."""
    from pipeline.model.rnnt import rnnt_loss as loss

    return loss(logits, labels, logit_lengths, label_lengths, blank)


class Transducer(Objective):
    """RNN-T with a stateless predictor (``model.transducer``)."""

    name = "transducer"
    emits = TRANSDUCER_OUTPUT
    too_short_rule = "transducer"

    def output_width(self, config, n_classes: int) -> int:
        """``model.transducer.joint_dim``: the family's output layer is the joiner's encoder projection."""
        return config.transducer.joint_dim

    def build_head(self, config, n_classes: int, precision: str):
        """The predictor and joiner (``TransducerHead``), its weights made (seeded by ``random_seed``)."""
        from pipeline.model.transducer_net import TransducerHead

        head = TransducerHead(
            config.transducer,
            n_classes,
            n_classes - 1,
            config.random_seed + 9000,
            name="transducer",
            dtype=precision,
        )
        head.build()
        return head

    def loss(
        self, labels, label_lengths, logits, logit_lengths, blank_index: int, jit_compile: bool, head=None
    ):
        """RNN-T loss of the joiner's scores of ``logits`` (the projected encoder frames) and ``labels``;
        on a GPU outside an XLA step, the loss alone compiled with XLA (``rnnt.compiled_alone``)."""
        from pipeline.model.rnnt import placed_rnnt_loss

        joint = head.joint(logits, labels)
        return placed_rnnt_loss(joint, labels, logit_lengths, label_lengths, blank_index, jit_compile)

    def best_labels(self, outputs, output_lengths, blank_index: int, head):
        """Batched greedy search, ``model.transducer.max_symbols`` labels a frame at most."""
        return head.greedy(outputs, output_lengths, head.max_symbols)

    def min_outputs(self, labels) -> int:
        """One output frame, whatever the transcript."""
        return 1


OBJECTIVE = Transducer()
