"""The ``deepspeech`` front end: numpy against TensorFlow's AudioSpectrogram + Mfcc ops and against a Coqui
model's own MFCC subgraph.

Measured tolerance: equal bit for bit wherever a coefficient's magnitude is above 1e-6 (99.7% of all
values of these signals, every value of speech); near zero (the higher coefficients of digital silence,
where the cosine tables leave ~1e-14 residues) they differ by at most 1e-12. Both compute in double and
round to float32 at the same two points, the power spectrum and the coefficients.
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile

from native_client.frontends.deepspeech import DeepSpeechFrontEnd, DeepSpeechSettings
from pipeline.config import ConfigError
from pipeline.config_loader import config_from_dict
from tests.conftest import SAMPLE


def tf_features(
    samples: np.ndarray,
    sample_rate: int = 16000,
    window: int = 512,
    stride: int = 320,
    lower: float = 20.0,
    upper: float = 8000.0,
    channels: int = 40,
    coefficients: int = 26,
):
    """TensorFlow's ops as Coqui STT's ``audio_to_features`` calls them: (power spectrum, MFCC)."""
    import tensorflow as tf

    signal = tf.constant((samples.astype(np.float32) / 32768.0)[:, None])
    spectrogram = tf.raw_ops.AudioSpectrogram(
        input=signal, window_size=window, stride=stride, magnitude_squared=True
    )
    mfcc = tf.raw_ops.Mfcc(
        spectrogram=spectrogram,
        sample_rate=sample_rate,
        upper_frequency_limit=upper,
        lower_frequency_limit=lower,
        filterbank_channel_count=channels,
        dct_coefficient_count=coefficients,
    )
    return spectrogram.numpy()[0], mfcc.numpy()[0]


def assert_matches_tensorflow(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Bit-equal where |value| > 1e-6, within 1e-12 elsewhere."""
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.float32
    large = np.abs(theirs) > 1e-6
    np.testing.assert_array_equal(ours[large], theirs[large])
    np.testing.assert_allclose(ours[~large], theirs[~large], rtol=0, atol=1e-12)


def signals() -> list[np.ndarray]:
    rng = np.random.default_rng(24)
    real = [soundfile.read(path, dtype="int16")[0] for path in sorted((SAMPLE / "test").glob("*.flac"))[:6]]
    return [
        rng.integers(-32768, 32768, 40_000).astype(np.int16),  # full-scale noise
        rng.normal(0, 30, 9_000).astype(np.int16),  # quiet noise
        np.zeros(3_000, np.int16),  # digital silence: every band at the floor
        np.full(1_000, 32767, np.int16),  # DC
        *real,
    ]


@pytest.mark.parametrize("index", range(10))
def test_equals_tensorflows_ops_on_noise_silence_and_speech(index):
    samples = signals()[index]
    frontend = DeepSpeechFrontEnd(DeepSpeechSettings(), 16000)
    spectrum, mfcc = tf_features(samples)
    # The FFTs differ (pocketfft, Ooura's) only in rounding: within 1e-14 of each frame's largest bin (exact
    # zeros of a DC signal come out as residues of 1e-30 either way).
    difference = np.abs(frontend.power_spectrum(samples.astype(np.float64)) - spectrum)
    assert np.all(difference <= 1e-14 * spectrum.max(axis=1, keepdims=True))
    assert_matches_tensorflow(frontend.frames(samples), mfcc)
    assert len(mfcc) == frontend.frame_count(len(samples)) == 1 + (len(samples) - 512) // 320


def test_other_settings_follow_tensorflow_too():
    settings = DeepSpeechSettings(
        numcep=13, filterbank_channels=20, winlen=0.025, winstep=0.01, lowfreq=125.0, highfreq=3800.0
    )
    frontend = DeepSpeechFrontEnd(settings, 8000)
    assert (frontend.frame_length, frontend.frame_step, frontend.fft_length) == (200, 80, 256)
    for samples in signals()[:2] + signals()[4:6]:
        _, mfcc = tf_features(samples, 8000, 200, 80, 125.0, 3800.0, 20, 13)
        assert_matches_tensorflow(frontend.frames(samples), mfcc)


def test_equals_the_coqui_models_own_mfcc_subgraph(armspeech_model):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(armspeech_model))
    interpreter.allocate_tensors()
    given = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    made = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    frontend = DeepSpeechFrontEnd(DeepSpeechSettings(), 16000)
    windows = [
        samples[start : start + 512] for samples in signals() for start in range(0, len(samples) - 511, 2900)
    ]
    assert len(windows) > 40
    for window in windows:
        interpreter.set_tensor(given["input_samples"], window.astype(np.float32) / 32768)
        interpreter.invoke()
        assert_matches_tensorflow(
            frontend.frames(window), interpreter.get_tensor(made["mfccs"]).reshape(1, 26)
        )


def test_final_window_adds_the_native_clients_zero_padded_last_frame():
    samples = signals()[4]
    plain = DeepSpeechFrontEnd(DeepSpeechSettings(), 16000)
    flushing = DeepSpeechFrontEnd(DeepSpeechSettings(final_window=True), 16000)
    whole = plain.frames(samples)
    with_last = flushing.frames(samples)
    np.testing.assert_array_equal(with_last[:-1], whole)
    rest = samples[len(whole) * 320 :]
    padded = np.concatenate([rest, np.zeros(512 - len(rest), np.int16)])
    np.testing.assert_array_equal(with_last[-1], plain.frames(padded)[0])
    # The native client flushes even an empty stream, and a stream of exactly one window, once more.
    assert [flushing.frame_count(n) for n in (0, 100, 512, 832, 833)] == [1, 1, 2, 3, 3]
    assert [plain.frame_count(n) for n in (0, 100, 512, 832, 833)] == [0, 0, 1, 2, 2]


def test_config_takes_the_front_ends_keys_and_refuses_bad_ones():
    config = config_from_dict({"features": {"type": "deepspeech", "winstep": 0.01}})
    assert config.features.numcep == 26 and config.features.winstep == 0.01
    with pytest.raises(ConfigError, match=r"features\.winlen: 0\.0321 s is not a whole number"):
        config_from_dict({"features": {"type": "deepspeech", "winlen": 0.0321}})
    with pytest.raises(ConfigError, match=r"features\.numcep: expected at most filterbank_channels \(40\)"):
        config_from_dict({"features": {"type": "deepspeech", "numcep": 41}})
    with pytest.raises(ConfigError, match=r"features\.highfreq: expected at most half the sample rate"):
        config_from_dict({"features": {"type": "deepspeech", "highfreq": 9000.0}})
