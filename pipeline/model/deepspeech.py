"""The DeepSpeech family: Mozilla DeepSpeech's acoustic model (its layers: ``deepspeech_net.py``).

Its settings (``DeepSpeechSettings``) go under ``model.deepspeech:``; the config loader also takes them as
the ``model`` section's own keys (``model.n_hidden``), as DeepSpeech's configs write them. One label per
feature frame; a streaming form over context windows carrying the LSTM's state. This module imports no
TensorFlow (the config loader reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.config import ModelConfig, family_option
from pipeline.model.family import WINDOWS, ModelFamily, StateTensor, StreamingForm, StreamInput


@dataclass(frozen=True)
class DeepSpeechSettings:
    """Mozilla DeepSpeech's geometry: 5 layers of n_hidden units (the 4th an LSTM) over context windows.
    DeepSpeech's own spelling (model.n_hidden and the rest as the section's own keys) is read too."""

    n_hidden: int = family_option(2048, "Width of the dense layers and the LSTM.", minimum=1)
    n_context: int = family_option(9, "Context frames on each side of a time step.", minimum=0)
    relu_clip: float = family_option(20.0, "Clip of the clipped ReLU.", minimum=0.0, exclusive_min=True)
    dropout_rate: float = family_option(
        0.05, "Dropout of layer 1 (and 2, 3, 6 unless set).", minimum=0.0, maximum=0.99
    )
    dropout_rate2: float | None = family_option(
        None, "Dropout of layer 2 (default: dropout_rate).", minimum=0.0, maximum=0.99
    )
    dropout_rate3: float | None = family_option(
        None, "Dropout of layer 3 (default: dropout_rate).", minimum=0.0, maximum=0.99
    )
    dropout_rate4: float = family_option(0.0, "Dropout after the LSTM.", minimum=0.0, maximum=0.99)
    dropout_rate5: float = family_option(0.0, "Dropout of the LSTM input.", minimum=0.0, maximum=0.99)
    dropout_rate6: float | None = family_option(
        None, "Dropout of layer 5 (default: dropout_rate).", minimum=0.0, maximum=0.99
    )
    lstm_kernel: Literal["auto", "fused", "layer"] = family_option(
        "auto",
        "How the deepspeech family runs its LSTM over a sequence: fused (the whole sequence's input and "
        "weight products as single matrix products, the backward pass written out: a training step 2.2-2.4x "
        "faster on a CPU at n_hidden 384, 3.5x at 2048), layer (Keras' LSTM layer: cuDNN on a GPU), auto "
        "(layer when a GPU is visible and the step computes in float32 or float16, else fused). Under "
        "training.jit_compile and in every export the LSTM is the fused one whatever this says (XLA has no "
        "kernel for cuDNN's, and an export runs on any device). The same function to float rounding, so "
        "not in any fingerprint; a run resumed with the other kernel continues, equal to rounding, not "
        "bit for bit.",
        stages=(),
    )


class DeepSpeech(ModelFamily):
    """Mozilla DeepSpeech's acoustic model (``model.deepspeech:`` n_hidden, n_context, relu_clip, ...)."""

    name = "deepspeech"
    Settings = DeepSpeechSettings

    def build(self, config: ModelConfig, n_input: int, n_classes: int, precision: str = "float32"):
        """The model with its weights made (deterministic for a given ``random_seed``)."""
        import tensorflow as tf

        from pipeline.model.deepspeech_net import AcousticModel

        model = AcousticModel(config, self.settings(config), n_input, n_classes, precision)
        model(tf.zeros([1, 1, n_input]))
        return model

    def encode(self, model, features, lengths, training: bool):
        """The output of layer 5 (after its dropout) ``[batch, time, n_hidden]``, and the lengths: one label
        per frame."""
        return model.encode(features, training=training), lengths

    def output_layer(self, model):
        """``layer_6``, the logits."""
        return model.layer_6

    def stream_input(self, config: ModelConfig, n_steps: int) -> StreamInput:
        """``n_steps`` context windows of ``n_context`` frames each side."""
        return StreamInput(WINDOWS, n_steps, context=self.settings(config).n_context)

    def state(self, config: ModelConfig) -> tuple[StateTensor, ...]:
        """The LSTM's output and cell state, DeepSpeech's ``previous_state_h``/``_c``."""
        shape = (1, self.settings(config).n_hidden)
        return (
            StateTensor("previous_state_h", "new_state_h", shape),
            StateTensor("previous_state_c", "new_state_c", shape),
        )

    def streaming(self, model, n_steps: int) -> StreamingForm:
        """``pipeline.model.deepspeech_net.DeepSpeechStreaming``: the LSTM's cell stepped frame by frame."""
        from pipeline.model.deepspeech_net import DeepSpeechStreaming

        return DeepSpeechStreaming(model, n_steps)

    def fold_normalization(self, weights: dict, mean, std) -> dict:
        """``layer_1`` takes context windows of frames: on a window of normalised frames ``(x - mean) /
        std`` its kernel times ``std`` and its bias plus ``mean`` through the kernel give what the source
        gave on raw frames (each value tiled over the window's frames). Padding differs: a window's zero
        frames past an utterance's edges stand for raw frames at the mean, where the source saw zeros."""
        import numpy as np

        kernel = np.asarray(weights["layer_1.kernel"], np.float64)
        window = kernel.shape[0] // len(mean)
        if window * len(mean) != kernel.shape[0]:
            raise ValueError(
                f"layer_1 takes {kernel.shape[0]} values, not windows of {len(mean)} coefficients"
            )
        scale, shift = np.tile(np.float64(std), window), np.tile(np.float64(mean), window)
        return {
            **weights,
            "layer_1.kernel": (kernel * scale[:, None]).astype(np.float32),
            "layer_1.bias": (np.float64(weights["layer_1.bias"]) + shift @ kernel).astype(np.float32),
        }

    def layers(self, model) -> tuple[str, ...]:
        """``layer_1``, ``layer_2``, ``layer_3``, ``lstm``, ``layer_5``, ``layer_6``."""
        return ("layer_1", "layer_2", "layer_3", "lstm", "layer_5", "layer_6")

    def import_weights(self, source, config, alphabet=None) -> dict | None:
        """The weights of a DeepSpeech 0.7+/Coqui ``.tflite`` (int8 dequantised) or of a DeepSpeech 0.6+/Coqui
        TF1 checkpoint (``pipeline.model.deepspeech_import``); None for anything else. The model's features
        must be the run's (``features.type: deepspeech``, its window, step, coefficients, sample rate) and,
        unless ``training.drop_source_layers`` re-initialises the output layer, its alphabet the run's."""
        from native_client.deepspeech_tflite import DeepSpeechTFLiteRunner, is_deepspeech_tflite
        from pipeline.model import deepspeech_import

        if is_deepspeech_tflite(source):
            metadata = DeepSpeechTFLiteRunner(source).metadata
            if config is not None:
                _check_features(source, metadata.features.frontend, config)
                if alphabet is not None and not config.training.drop_source_layers:
                    _check_alphabet(source, metadata.alphabet.labels, alphabet.labels)
            return deepspeech_import.to_family_names(deepspeech_import.read_tflite(source).__getitem__)
        if deepspeech_import.is_tf1_checkpoint(source):
            if config is not None:
                _check_features(source, deepspeech_import.checkpoint_frontend(source), config)
                theirs = deepspeech_import.checkpoint_alphabet(source)
                if theirs is not None and alphabet is not None and not config.training.drop_source_layers:
                    _check_alphabet(source, theirs.labels, alphabet.labels)
            variables = deepspeech_import.read_tf1_checkpoint(source)
            return deepspeech_import.to_family_names(variables.__getitem__)
        return None


def _check_features(source, theirs, config) -> None:
    """ValueError unless the run's front end computes the features ``theirs`` (a FrontEnd) computes, not
    normalised per utterance: their layers were trained on raw features (global normalisation's statistics
    are folded into the first layer by the warm start: ``fold_normalization``)."""
    from pipeline.features.frontend import feature_pipeline

    ours = feature_pipeline(config.features)
    settings = {**theirs.describe(), "final_window": False}
    same = (
        ours.type_name == theirs.name
        and ours.normalize in (False, "global")
        and ours.sample_rate == theirs.sample_rate
        and {**ours.frontend.describe(), "final_window": False} == settings
    )
    if not same:
        wanted = {k: v for k, v in settings.items() if k not in ("type", "final_window")}
        raise ValueError(
            f"{source} was trained on DeepSpeech's features ({theirs.sample_rate} Hz, {wanted}); the run "
            f"computes features.type {ours.type_name!r}: set features.type: deepspeech with those settings, "
            f"features.sample_rate: {theirs.sample_rate} and features.normalize: false or global"
        )


def _check_alphabet(source, theirs: tuple, ours: tuple) -> None:
    """ValueError naming the difference when the alphabets differ (the outputs would mean other letters)."""
    if tuple(theirs) != tuple(ours):
        raise ValueError(
            f"{source} has another alphabet than paths.alphabet ({len(theirs)} labels {''.join(theirs)!r} vs "
            f"{len(ours)} {''.join(ours)!r}): use the model's alphabet in its order, or set "
            f"training.drop_source_layers: 1 to re-initialise the output layer for yours"
        )


FAMILY = DeepSpeech()
