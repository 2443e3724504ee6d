"""native_client/audio.py: every format and sample format libsndfile reads, lying headers, resampling,
segments, streaming (issue 26 rows N1 and N5, issue 22 item 3)."""

import struct
import subprocess
import sys

import numpy as np
import pytest
import soundfile

from native_client.audio import AudioError, load_checked, probe, stream_for_model
from tests.conftest import ROOT
from tests.corpus_layouts import tone

RATE = 16000


def _speechlike(seconds: float = 1.0, rate: int = RATE) -> np.ndarray:
    """A float signal in [-0.6, 0.6] with several frequencies (so any scaling error shows)."""
    t = np.arange(int(seconds * rate)) / rate
    return (
        0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1250 * t) + 0.1 * np.sin(7 * t)
    ).astype(np.float32)


@pytest.mark.parametrize("subtype", ["FLOAT", "DOUBLE"])
def test_float_wavs_are_not_read_as_silence(tmp_path, subtype):
    """N1: float32/float64 WAV samples read as int16 came back all zero (libsndfile does not scale
    floats to integers by default): the row was kept and the model learnt silence for its transcript,
    and the client printed an empty transcript. They now read as the same int16 samples as a 16-bit
    copy of the audio, in Features (load_checked) and in the client (stream_for_model)."""
    signal = _speechlike()
    soundfile.write(tmp_path / "f.wav", signal, RATE, subtype=subtype)
    soundfile.write(tmp_path / "i16.wav", signal, RATE, subtype="PCM_16")
    reference = load_checked(tmp_path / "i16.wav", RATE)
    assert np.abs(reference).max() > 15000
    got = load_checked(tmp_path / "f.wav", RATE)
    assert np.abs(got.astype(int) - reference).max() <= 1
    streamed = np.concatenate(list(stream_for_model(tmp_path / "f.wav", RATE, block_seconds=0.3)))
    assert np.abs(streamed.astype(int) - reference).max() <= 1


def test_the_client_reads_a_float_wav_as_audio_not_silence(tmp_path):
    """N1 through the command line: the client's audio path gives the float WAV's real samples (the
    client reads with stream_for_model; this runs it in a child process as the client would)."""
    signal = _speechlike()
    soundfile.write(tmp_path / "f32.wav", signal, RATE, subtype="FLOAT")
    code = (
        "import sys, numpy as np; from native_client.audio import stream_for_model;"
        "x = np.concatenate(list(stream_for_model(sys.argv[1], 16000)));"
        "print(int(np.abs(x.astype(int)).max()))"
    )
    peak = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "f32.wav")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(peak.stdout) > 15000


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "ULAW", "ALAW", "FLOAT"])
def test_every_wav_sample_format_reads_at_the_same_scale(tmp_path, subtype):
    """8/16/24/32-bit integer, mu-law, A-law and float WAVs of one signal read within the format's own
    quantisation of each other."""
    signal = _speechlike()
    soundfile.write(tmp_path / "x.wav", signal, RATE, subtype=subtype)
    got = load_checked(tmp_path / "x.wav", RATE).astype(np.float64) / 32768
    tolerance = {"PCM_U8": 0.01, "ULAW": 0.02, "ALAW": 0.02}.get(subtype, 1e-4)
    assert np.abs(got - signal).max() < tolerance


def _wav_with_sizes(source, target, riff=None, data=None):
    raw = bytearray(source.read_bytes())
    assert raw[36:40] == b"data"
    if riff is not None:
        raw[4:8] = struct.pack("<I", riff)
    if data is not None:
        raw[40:44] = struct.pack("<I", data)
    target.write_bytes(bytes(raw))
    return target


@pytest.fixture
def two_second_wav(tmp_path):
    path = tmp_path / "two.wav"
    soundfile.write(path, _speechlike(2.0), RATE, subtype="PCM_16")
    return path


def test_a_wav_cut_to_half_its_data_is_refused_as_truncated(tmp_path, two_second_wav):
    """N5: a WAV cut to half its data was kept as 1.0 s with the full 2 s transcript (libsndfile
    quietly shortens it to the bytes present); it is now refused as ``truncated_audio``, in Features
    and in the client, naming the file and both lengths."""
    half = tmp_path / "half.wav"
    half.write_bytes(two_second_wav.read_bytes()[: 44 + RATE * 2 // 2])
    with pytest.raises(
        AudioError, match=r"half.wav: header claims 32000 frames .* holds 8000 frames"
    ) as error:
        load_checked(half, RATE)
    assert error.value.reason == "truncated_audio"
    with pytest.raises(AudioError) as error:
        list(stream_for_model(half, RATE))
    assert error.value.reason == "truncated_audio"


@pytest.mark.parametrize(
    "sizes",
    [
        {"riff": 36 + 20 * RATE * 2, "data": 20 * RATE * 2},  # claims 20 s
        {"riff": 0xFFFFFFFF, "data": 0xFFFFFFFF},  # a stream writer's placeholder
        {"data": 0},  # an unfinished header: no length, the samples follow
    ],
)
def test_lying_wav_headers_are_refused_as_truncated(tmp_path, two_second_wav, sizes):
    """N5: headers claiming 20 s or 0xFFFFFFFF bytes were accepted at the length actually present."""
    lying = _wav_with_sizes(two_second_wav, tmp_path / "lying.wav", **sizes)
    with pytest.raises(AudioError) as error:
        load_checked(lying, RATE)
    assert error.value.reason == "truncated_audio"
    assert "lying.wav" in str(error.value)


def test_truncated_files_are_rejected_by_the_features_stage(tmp_path, two_second_wav):
    """N5 in Features: the truncated row is a reject with its reason, the good row is kept."""
    from pipeline.config import FeaturesConfig
    from pipeline.features.shards import process_shard

    half = tmp_path / "half.wav"
    half.write_bytes(two_second_wav.read_bytes()[: 44 + RATE])
    part = tmp_path / "part.npz"
    process_shard(str(part), [(str(two_second_wav), 1), (str(half), 1)], FeaturesConfig(), 0.0)
    with np.load(part) as saved:
        assert list(saved["reasons"]) == ["", "truncated_audio"]
        assert saved["lengths"][0] > 0


def test_truncated_sphere_and_mp3_are_refused(tmp_path):
    """A SPHERE file whose sample_count exceeds its bytes, and an MP3 cut in half (decoding ends
    long before the frame count of its header), are truncated_audio too."""
    signal = _speechlike(2.0)
    soundfile.write(tmp_path / "full.sph", signal, RATE, format="NIST", subtype="PCM_16")
    data = (tmp_path / "full.sph").read_bytes()
    (tmp_path / "cut.sph").write_bytes(data[: len(data) // 2])
    soundfile.write(tmp_path / "full.mp3", signal, RATE, format="MP3")
    data = (tmp_path / "full.mp3").read_bytes()
    (tmp_path / "cut.mp3").write_bytes(data[: len(data) // 2])
    assert len(load_checked(tmp_path / "full.sph", RATE)) == 2 * RATE
    assert abs(len(load_checked(tmp_path / "full.mp3", RATE)) - 2 * RATE) < RATE // 10
    for name in ("cut.sph", "cut.mp3"):
        with pytest.raises(AudioError) as error:
            load_checked(tmp_path / name, RATE)
        assert error.value.reason == "truncated_audio", name


@pytest.mark.parametrize(
    "name, write",
    [
        ("x.flac", {}),
        ("x.mp3", {"format": "MP3"}),
        ("x.ogg", {"format": "OGG", "subtype": "VORBIS"}),
        ("x.opus", {"format": "OGG", "subtype": "OPUS"}),
        ("x.sph", {"format": "NIST", "subtype": "PCM_16"}),
        ("x.aiff", {"format": "AIFF", "subtype": "PCM_16"}),
    ],
)
def test_formats_libsndfile_reads_decode_to_the_signal(tmp_path, name, write):
    """FLAC, MP3, Ogg Vorbis, Ogg Opus, NIST SPHERE and AIFF at 48 kHz stereo come out as 16 kHz mono
    int16 with the tone where it was (lossy codecs within their accuracy)."""
    rate = 48000
    t = np.arange(rate) / rate
    left = 0.4 * np.sin(2 * np.pi * 440 * t)
    soundfile.write(tmp_path / name, np.stack([left, left], axis=1).astype(np.float32), rate, **write)
    got = load_checked(tmp_path / name, RATE, convert_rate=True).astype(np.float64) / 32768
    assert abs(len(got) - RATE) < RATE // 20
    spectrum = np.abs(np.fft.rfft(got[: RATE // 2]))
    assert abs(np.argmax(spectrum) * 2 - 440) <= 4
    assert 0.3 < np.abs(got[RATE // 10 : RATE // 2]).max() < 0.5


def test_resampling_is_band_limited_and_streams_like_one_shot(tmp_path):
    """libsoxr: a 44.1 kHz file resampled to 16 kHz keeps a 1 kHz tone and removes a 12 kHz one (above
    the new Nyquist frequency: a naive decimation would fold it to 4.1 kHz); the client's block-by-block
    resampling equals the one-shot result."""
    rate = 44100
    t = np.arange(3 * rate) / rate
    signal = 0.3 * np.sin(2 * np.pi * 1000 * t) + 0.3 * np.sin(2 * np.pi * 12000 * t)
    soundfile.write(tmp_path / "cd.flac", signal.astype(np.float32), rate)
    whole = load_checked(tmp_path / "cd.flac", RATE, convert_rate=True)
    assert len(whole) == 3 * RATE
    spectrum = np.abs(np.fft.rfft(whole.astype(np.float64)))
    frequencies = np.fft.rfftfreq(len(whole), 1 / RATE)
    assert abs(frequencies[np.argmax(spectrum)] - 1000) < 2
    folded = spectrum[np.abs(frequencies - 4100) < 50].max()
    assert folded < spectrum.max() * 1e-3
    rates = []
    streamed = np.concatenate(list(stream_for_model(tmp_path / "cd.flac", RATE, True, 0.37, rates.append)))
    assert rates == [rate]
    assert len(streamed) == len(whole) and np.abs(streamed.astype(int) - whole).max() <= 1
    with pytest.raises(AudioError, match="sample rate 44100 Hz, expected 16000 Hz") as error:
        load_checked(tmp_path / "cd.flac", RATE)
    assert error.value.reason == "wrong_sample_rate"


def test_the_client_resamples_in_blocks_without_reading_the_whole_file(tmp_path, monkeypatch):
    """Issue 26 L7: resampling in the client used to read the whole file; now every read is one block."""
    import native_client.audio as audio

    path = tone(tmp_path / "long.flac", 30.0, 440, rate=44100)
    biggest = []
    real_blocks = soundfile.blocks

    def watched(*args, **kwargs):
        for block in real_blocks(*args, **kwargs):
            biggest.append(len(block))
            yield block

    monkeypatch.setattr(audio.soundfile, "blocks", watched)
    monkeypatch.setattr(audio.soundfile, "read", None)  # a whole-file read would fail
    total = sum(len(b) for b in stream_for_model(path, RATE, True, block_seconds=2.0))
    assert abs(total - 30 * RATE) <= 1
    assert max(biggest) == 2 * 44100 and len(biggest) == 15


@pytest.mark.parametrize(
    "name, write", [("x.flac", {}), ("x.wav", {"subtype": "PCM_16"}), ("x.sph", {"format": "NIST"})]
)
def test_a_segment_equals_that_slice_of_the_whole_file(tmp_path, name, write):
    """offset/duration read exactly the frames of that span (FLAC, WAV and SPHERE seek exactly)."""
    soundfile.write(tmp_path / name, _speechlike(3.0), RATE, **write)
    whole = load_checked(tmp_path / name, RATE)
    segment = load_checked(tmp_path / name, RATE, offset=1.25, duration=0.5)
    assert np.array_equal(segment, whole[20000:28000])
    tail = load_checked(tmp_path / name, RATE, offset=2.5)
    assert np.array_equal(tail, whole[40000:])


def test_segments_outside_the_file_are_refused(tmp_path):
    """A segment starting after the end, or ending more than 50 ms past it, is segment_out_of_range; one
    ending within 50 ms of the end (rounded corpus times) is read to the end."""
    soundfile.write(tmp_path / "x.flac", _speechlike(2.0), RATE)
    assert len(load_checked(tmp_path / "x.flac", RATE, offset=1.5, duration=0.52)) == RATE // 2
    for offset, duration in ((2.5, 0.5), (1.5, 1.0), (-1.0, 0.5), (0.5, 0.0)):
        with pytest.raises(AudioError) as error:
            load_checked(tmp_path / "x.flac", RATE, offset=offset, duration=duration)
        assert error.value.reason == "segment_out_of_range", (offset, duration)


def test_probe_names_what_is_wrong(tmp_path):
    """Missing, empty, header-only, directory and non-audio files each get their own reason, from the
    header alone."""
    (tmp_path / "empty.wav").write_bytes(b"")
    soundfile.write(tmp_path / "header.wav", np.zeros(0, np.int16), RATE, subtype="PCM_16")
    (tmp_path / "text.wav").write_text("not audio at all " * 10)
    (tmp_path / "folder.wav").mkdir()
    expected = {
        "none.wav": "missing_file",
        "empty.wav": "empty_audio",
        "header.wav": "empty_audio",
        "text.wav": "unreadable_audio",
        "folder.wav": "unreadable_audio",
    }
    for name, reason in expected.items():
        with pytest.raises(AudioError) as error:
            probe(tmp_path / name)
        assert error.value.reason == reason and name in str(error.value)
    info = probe(tone(tmp_path / "ok.flac", 1.5, 300))
    assert (info.frames, info.sample_rate, info.channels, info.duration) == (24000, RATE, 1, 1.5)


def test_shorten_compressed_sphere_is_named_as_such(tmp_path):
    """libsndfile does not decode shorten; the message says so and what converts it."""
    signal = _speechlike(0.5)
    soundfile.write(tmp_path / "x.sph", signal, RATE, format="NIST", subtype="PCM_16")
    raw = (tmp_path / "x.sph").read_bytes()
    header = raw[:1024].replace(
        b"sample_coding -s3 pcm\n", b"sample_coding -s26 pcm,embedded-shorten-v2.00\n"
    )
    assert header != raw[:1024]
    (tmp_path / "shorten.sph").write_bytes(header[:1024].ljust(1024, b"\0") + b"ajkg\x02" + bytes(200))
    with pytest.raises(AudioError, match="shorten .*sph2pipe") as error:
        probe(tmp_path / "shorten.sph")
    assert error.value.reason == "unreadable_audio"


def test_nan_samples_are_a_reject_of_the_features_stage(tmp_path, two_second_wav):
    """Issue 37 row 13 in Features: a float WAV holding a NaN is a reject (``non_finite_audio``), counted,
    and the good row is kept."""
    from pipeline.config import FeaturesConfig
    from pipeline.features.shards import process_shard

    samples, _ = soundfile.read(two_second_wav, dtype="float32")
    samples[RATE] = np.nan
    poisoned = tmp_path / "nan.wav"
    soundfile.write(poisoned, samples, RATE, subtype="FLOAT")
    part = tmp_path / "part.npz"
    process_shard(str(part), [(str(two_second_wav), 1), (str(poisoned), 1)], FeaturesConfig(), 0.0)
    with np.load(part) as saved:
        assert list(saved["reasons"]) == ["", "non_finite_audio"]
        assert saved["lengths"][0] > 0
