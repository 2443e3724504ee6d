"""Voice activity detection on the sample's test clips between silences, clean and with white noise:
frame accuracy against where the clips are, utterances found, and the detector's speed.

    PYTHONPATH=. python bench/vad.py
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import soundfile

from native_client.vad import End, Segmenter, VadSettings

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample" / "test"
RATE = 16000


def long_signal(noise_db: float | None, seed: int = 0):
    rng = np.random.default_rng(seed)
    pieces, truth, at = [], [], 0
    for clip in sorted(SAMPLE.glob("*.flac")):
        samples, _ = soundfile.read(clip, dtype="int16")
        gap = int(rng.uniform(1.0, 4.0) * RATE)
        pieces += [np.zeros(gap, np.int16), samples]
        truth.append((at + gap, at + gap + len(samples)))
        at += gap + len(samples)
    signal = np.concatenate(pieces).astype(np.float64)
    if noise_db is not None:
        speech_rms = np.sqrt(np.mean(np.concatenate([signal[s:e] for s, e in truth]) ** 2))
        signal += rng.normal(0, speech_rms / 10 ** (noise_db / 20), len(signal))
    return np.clip(signal, -32768, 32767).astype(np.int16), truth


def main() -> None:
    print("condition,clips,utterances,frame_accuracy,utterance_start_error_ms_p50,seconds_per_audio_hour")
    for noise in (None, 20.0, 10.0):
        signal, truth = long_signal(noise)
        segmenter = Segmenter(RATE, VadSettings())
        started = time.perf_counter()
        ends = [e for e in segmenter.feed(signal) + segmenter.finish() if isinstance(e, End)]
        elapsed = time.perf_counter() - started
        found = np.zeros(len(signal), bool)
        for end in ends:
            found[end.speech_start : end.speech_end] = True
        expected = np.zeros(len(signal), bool)
        for start, stop in truth:
            expected[start:stop] = True
        starts = np.array([e.speech_start for e in ends])
        errors = [np.min(np.abs(starts - s)) / RATE * 1000 for s, _ in truth] if len(starts) else [np.nan]
        print(
            f"{'clean' if noise is None else f'white noise {noise:g} dB SNR'},{len(truth)},{len(ends)},"
            f"{np.mean(found == expected):.3f},{np.median(errors):.0f},"
            f"{elapsed / (len(signal) / RATE) * 3600:.2f}"
        )


if __name__ == "__main__":
    main()
