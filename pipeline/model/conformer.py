"""The Conformer-CTC family (``model.architecture: conformer``; its layers: ``conformer_net.py``).

Gulati et al. 2020 as NeMo's Conformer-CTC builds it: a convolutional front that subsamples time
(``subsampling``: 4x at 10 ms features, 2x at DeepSpeech's 20 ms front end), then ``layers`` blocks of
half a feed-forward module, multi-head self-attention (rotary positions: nothing to shift, simpler to
stream and convert than the relative-position scheme), a depthwise convolution module and the other half
feed-forward module, each residual, the block closed by layer normalisation; a linear layer gives CTC
logits over characters or bytes.

It streams as WeNet's U2 does: trained with dynamic chunk masks (each batch's attention restricted to its own
chunk and ``left_chunks`` chunks before it, the chunk size drawn at random, full context some of the time)
and a causal convolution module and subsampling, it runs ``chunk_frames`` labels at a time with each
block's left keys and values and its convolution's last inputs carried as state
(``conformer_net.ConformerStreaming``). Evaluate, the export and the client all run that chunked
computation; Evaluate reports the full-context figures beside it. This module imports no TensorFlow (the
config loader reads ``Settings`` from it).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ModelConfig, family_option
from pipeline.model.family import FRAMES, ModelFamily, StateTensor, StreamingForm, StreamInput

SUBSAMPLINGS = (1, 2, 4, 8)


@dataclass(frozen=True)
class ConformerSettings:
    """A Conformer-CTC encoder: NeMo's Conformer-CTC medium is d_model 256, 18 layers, 4 heads
    (configs/en-conformer.yaml, about 30 M parameters)."""

    d_model: int = family_option(
        144, "Width of the encoder (attention, convolution, residual stream).", minimum=8
    )
    heads: int = family_option(4, "Attention heads; d_model / heads must be an even number.", minimum=1)
    layers: int = family_option(4, "Conformer blocks.", minimum=1, maximum=64)
    conv_kernel: int = family_option(
        15, "Width in output frames of the depthwise convolution (odd).", minimum=3, maximum=63
    )
    subsampling: int = family_option(
        4,
        "Feature frames per output label (1, 2, 4 or 8), made by stride-2 convolutions: 4 at 10 ms features "
        "(mfcc, logfbank: 40 ms a label), 2 at the deepspeech front end's 20 ms.",
        minimum=1,
        maximum=8,
    )
    subsampling_channels: int = family_option(
        64, "Channels of the subsampling convolutions.", minimum=1, maximum=1024
    )
    ff_mult: int = family_option(
        4, "Inner width of the feed-forward modules, in multiples of d_model.", minimum=1
    )
    dropout: float = family_option(
        0.1, "Dropout of the feed-forward, convolution and attention outputs.", minimum=0.0, maximum=0.9
    )
    attention_dropout: float = family_option(
        0.1, "Dropout of the attention weights.", minimum=0.0, maximum=0.9
    )
    chunk_frames: int = family_option(
        8,
        "Output labels per streaming call: the chunk its attention sees at once (8 at 40 ms a label: 320 ms, "
        "one DeepSpeech streaming call). Evaluate, validation, the export and the client run this chunk "
        "size; training draws chunk sizes at random (1 to 25 labels, or the full utterance).",
        minimum=1,
        maximum=256,
    )
    left_chunks: int = family_option(
        4,
        "Chunks before its own that a label's attention sees, in training and at inference: the left "
        "context is left_chunks x chunk_frames labels, cached between streaming calls.",
        minimum=1,
        maximum=64,
    )


class Conformer(ModelFamily):
    """Conformer-CTC, streamed chunk by chunk."""

    name = "conformer"
    Settings = ConformerSettings

    def check(self, config: ModelConfig) -> None:
        """The heads divide d_model into even widths (rotary positions rotate pairs), the subsampling is a
        power of two, the convolution kernel odd."""
        settings = config.options
        if settings.d_model % settings.heads or (settings.d_model // settings.heads) % 2:
            raise ValueError(
                f"model.conformer.heads: {settings.heads} heads do not split d_model {settings.d_model} into "
                f"widths of an even number"
            )
        if settings.subsampling not in SUBSAMPLINGS:
            raise ValueError(
                f"model.conformer.subsampling: expected 1, 2, 4 or 8, got {settings.subsampling}"
            )
        if settings.conv_kernel % 2 == 0:
            raise ValueError(
                f"model.conformer.conv_kernel: expected an odd width, got {settings.conv_kernel}"
            )

    def build(self, config: ModelConfig, n_input: int, n_classes: int, precision: str = "float32"):
        """The model with its weights made (deterministic for a given ``random_seed``)."""
        import tensorflow as tf

        from pipeline.model.conformer_net import ConformerModel

        model = ConformerModel(config, n_input, n_classes, precision)
        model(tf.zeros([1, config.options.subsampling, n_input]))
        return model

    def stride(self, config: ModelConfig) -> int:
        """``model.conformer.subsampling``."""
        return config.options.subsampling

    def forward(self, model, features, lengths, training: bool, full_context: bool = False):
        """Logits and output lengths: in training with a chunk size drawn per batch (``conformer_net``), else
        the chunked computation the export streams (``chunk_frames``), or with ``full_context`` every label
        seeing the whole utterance. The padding of a batch changes nothing, so an utterance's logits do not
        depend on what it is batched with."""
        from pipeline.model.conformer_net import DYNAMIC

        settings = model.model_config.options
        chunk = None if full_context else DYNAMIC if training else settings.chunk_frames
        return model(features, lengths=lengths, training=training, chunk=chunk), self.output_lengths(
            model.model_config, lengths
        )

    def limits_context(self, config: ModelConfig) -> bool:
        """True: its inference is chunked; Evaluate reports the full-context figures beside."""
        return True

    def utterance(self, model, features):
        """The chunked computation over a whole utterance (what the streaming form gives)."""
        return model(features, training=False, chunk=model.model_config.options.chunk_frames)

    # -- streaming --------------------------------------------------------------------------------------
    def lookback(self, config: ModelConfig) -> int:
        """Feature frames before a chunk that its subsampling reads: ``subsampling - 1``."""
        return config.options.subsampling - 1

    def stream_input(self, config: ModelConfig, n_steps: int) -> StreamInput:
        """Chunks of ``chunk_frames x subsampling`` feature frames (``export.n_steps`` is not used) and the
        subsampling's look-back frames before each; no look-ahead."""
        settings = config.options
        return StreamInput(
            FRAMES, settings.chunk_frames * settings.subsampling, lookback=self.lookback(config)
        )

    def state(self, config: ModelConfig) -> tuple[StateTensor, ...]:
        """``cache_count`` (labels in the attention caches, up to ``left_chunks x chunk_frames``), then per
        block ``block_<i>_attention`` (its left keys, before rotary positions, and values: ``[1, 2, heads,
        left_chunks x chunk_frames, d_model / heads]``) and ``block_<i>_conv`` (the depthwise convolution's
        last ``conv_kernel - 1`` inputs ``[1, conv_kernel - 1, d_model]``); outputs ``new_<name>``."""
        settings = config.options
        left = settings.left_chunks * settings.chunk_frames
        width = settings.d_model // settings.heads
        shapes = [("cache_count", (1, 1))]
        for i in range(settings.layers):
            shapes.append((f"block_{i}_attention", (1, 2, settings.heads, left, width)))
            shapes.append((f"block_{i}_conv", (1, settings.conv_kernel - 1, settings.d_model)))
        return tuple(StateTensor(name, f"new_{name}", shape) for name, shape in shapes)

    def streaming(self, model, n_steps: int) -> StreamingForm:
        """``conformer_net.ConformerStreaming``: one chunk of labels a call over the model's own layers."""
        from pipeline.model.conformer_net import ConformerStreaming

        return ConformerStreaming(model, self)

    def encode(self, model, features, lengths, training: bool):
        """The last block's output ``[batch, time / subsampling, d_model]`` (chunked as ``forward``'s, with
        a chunk size drawn per batch in training) and the output lengths."""
        from pipeline.model.conformer_net import DYNAMIC

        chunk = DYNAMIC if training else model.model_config.options.chunk_frames
        return model.encode(features, lengths=lengths, training=training, chunk=chunk), self.output_lengths(
            model.model_config, lengths
        )

    def output_layer(self, model):
        """``output``, the logits."""
        return model.output_layer

    def layers(self, model) -> tuple[str, ...]:
        """``subsampling``, ``block_0`` ... ``block_<layers - 1>``, ``output``."""
        return ("subsampling", *(f"block_{i}" for i in range(model.model_config.options.layers)), "output")


FAMILY = Conformer()
