"""The Conformer-CTC family (``model.architecture: conformer``; its layers: ``conformer_net.py``).

Gulati et al. 2020 as NeMo's Conformer-CTC builds it: a convolutional front that subsamples time
(``subsampling``: 4x at 10 ms features, 2x at DeepSpeech's 20 ms front end), then ``layers`` blocks of
half a feed-forward module, multi-head self-attention (rotary positions: nothing to shift, simpler to
stream and convert than the relative-position scheme), a depthwise convolution module and the other half
feed-forward module, each residual, the block closed by layer normalisation; a linear layer gives CTC
logits over characters or bytes. Full context: no streaming form yet (the client runs whole utterances).
This module imports no TensorFlow (the config loader reads ``Settings`` from it).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ModelConfig, family_option
from pipeline.model.family import ModelFamily

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


class Conformer(ModelFamily):
    """Conformer-CTC, full context."""

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

    def forward(self, model, features, lengths, training: bool):
        """Logits and output lengths; the padding of a batch is masked out of attention and convolutions,
        so an utterance's logits do not depend on what it is batched with."""
        return model(features, lengths=lengths, training=training), self.output_lengths(
            model.model_config, lengths
        )

    def encode(self, model, features, lengths, training: bool):
        """The last block's output ``[batch, time / subsampling, d_model]`` and the output lengths."""
        return model.encode(features, lengths=lengths, training=training), self.output_lengths(
            model.model_config, lengths
        )

    def output_layer(self, model):
        """``output``, the logits."""
        return model.output_layer

    def layers(self, model) -> tuple[str, ...]:
        """``subsampling``, ``block_0`` ... ``block_<layers - 1>``, ``output``."""
        return ("subsampling", *(f"block_{i}" for i in range(model.model_config.options.layers)), "output")


FAMILY = Conformer()
