import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import soundfile
from python_speech_features import mfcc

from native_client.alphabet import load_alphabet
from native_client.frontends.mfcc import MfccSettings
from pipeline.config import FeaturesConfig
from pipeline.config_loader import load_config
from pipeline.data.manifests import CorpusError, read_manifests
from pipeline.data.text import TextSettings
from pipeline.features.cache import CacheError, check_settings, read_cache
from native_client.windows import context_windows
from pipeline.features.frontend import ctc_min_frames
from pipeline.layout import Layout
from pipeline.stages.features import build_split_cache
from tests.conftest import ALPHABET, ROOT, SAMPLE
from tests.corpus_factory import bad_corpus, sample_rows, write_manifest


def _config(write_config, tmp_path, manifest, extra=""):
    return load_config(
        write_config(f"""
        paths:
          work_dir: {tmp_path / "work"}
          alphabet: {ALPHABET}
        data:
          train_files: [{manifest}]
          max_reject_fraction: 1.0
        {extra}
    """)
    )


def test_bad_corpus_rejects_exactly_the_bad_rows(write_config, tmp_path):
    manifest, expected = bad_corpus(tmp_path / "corpus")
    config = _config(write_config, tmp_path, manifest)
    summary = build_split_cache(Layout(config), "train")
    assert summary.kept == 3
    with open(summary.rejects_report, newline="") as handle:
        rejects = {Path(row["wav_filename"]).name: row for row in csv.DictReader(handle)}
    assert {name: row["reason"] for name, row in rejects.items()} == expected
    assert "'é'" in rejects["accents.flac"]["detail"] and "'ï'" in rejects["accents.flac"]["detail"]
    assert "bad.csv:" in rejects["stereo.wav"]["source"]
    assert "8000 Hz" in rejects["rate8k.wav"]["detail"]
    cached = read_cache(Path(summary.cache), config.features)
    assert sorted(Path(p).name for p in cached.paths) == ["good0.flac", "good1.flac", "good2.flac"]


def test_resample_and_downmix_keep_those_rows(write_config, tmp_path):
    manifest, expected = bad_corpus(tmp_path / "corpus")
    config = _config(
        write_config, tmp_path, manifest, "features:\n          resample: true\n          downmix: true"
    )
    summary = build_split_cache(Layout(config), "train")
    assert summary.kept == 5
    assert "wrong_sample_rate" not in summary.reasons and "too_many_channels" not in summary.reasons


def test_too_many_rejects_fail_naming_split_and_reasons(write_config, tmp_path):
    manifest, _ = bad_corpus(tmp_path / "corpus")
    config = _config(write_config, tmp_path, manifest, "")
    config = load_config(
        write_config(
            Path(config.source).read_text().replace("max_reject_fraction: 1.0", "max_reject_fraction: 0.05"),
            "strict.yaml",
        )
    )
    with pytest.raises(CorpusError, match=r"split 'train': 9 of 12 rows rejected .*top reasons: ") as error:
        build_split_cache(Layout(config), "train")
    assert "rejects.csv" in str(error.value)
    assert not Layout(config).features_cache("train").exists()
    assert Layout(config).rejects_report("train").exists()


def test_raising_max_reject_fraction_reuses_the_extracted_shards(write_config, tmp_path, monkeypatch, caplog):
    import pipeline.stages.features as featurize

    manifest, _ = bad_corpus(tmp_path / "corpus")
    lenient = _config(write_config, tmp_path, manifest, "")
    strict = load_config(
        write_config(
            Path(lenient.source).read_text().replace("max_reject_fraction: 1.0", "max_reject_fraction: 0.05"),
            "strict.yaml",
        )
    )
    assert Layout(strict).features_fingerprint("train") == Layout(lenient).features_fingerprint("train")
    with pytest.raises(CorpusError):
        build_split_cache(Layout(strict), "train")
    parts = sorted(Layout(strict).features_parts("train").glob("*.npz"))
    assert parts
    parts[0].write_bytes(parts[0].read_bytes()[:100])  # a damaged shard is recomputed, with a warning
    computed = []
    real = featurize._process_shard
    monkeypatch.setattr(
        featurize, "_process_shard", lambda part, *args: computed.append(part) or real(part, *args)
    )
    summary = build_split_cache(Layout(lenient), "train")
    assert summary.kept == 3 and computed == [str(parts[0])]
    assert any(str(parts[0]) in r.message and "damaged" in r.message for r in caplog.records)


def test_max_duration_rejects_long_utterances_as_too_long(write_config, tmp_path):
    rows = sample_rows(count=4)
    manifest = write_manifest(tmp_path / "four.csv", [(str(path), text) for path, text in rows])
    durations = [soundfile.info(str(path)).duration for path, _ in rows]
    limit = sorted(durations)[1] + 0.01
    config = _config(write_config, tmp_path, manifest, f"  max_duration_s: {limit}")
    summary = build_split_cache(Layout(config), "train")
    assert summary.kept == 2 and summary.reasons == {"too_long": 2}
    with open(summary.rejects_report, newline="") as handle:
        assert all("data.max_duration_s" in row["detail"] for row in csv.DictReader(handle))


def test_manifest_without_a_column_is_a_clear_error(tmp_path):
    audio, transcript = sample_rows(count=1)[0]
    manifest = tmp_path / "nocol.csv"
    manifest.write_text(f"wav_filename,transcript\n{audio},{transcript}\n")
    with pytest.raises(CorpusError, match=r"nocol\.csv:1: header lacks column\(s\) wav_filesize"):
        read_manifests([manifest], 0, load_alphabet(ALPHABET), TextSettings())


def test_limit_keeps_the_first_rows(tmp_path):
    samples, rejects = read_manifests([SAMPLE / "dev.csv"], 5, load_alphabet(ALPHABET), TextSettings())
    assert len(samples) == 5 and not rejects
    assert samples[0].source.endswith("dev.csv:2")


def test_cached_features_equal_python_speech_features(write_config, tmp_path):
    rows = sample_rows(count=2)
    manifest = write_manifest(tmp_path / "two.csv", [(str(path), text) for path, text in rows])
    config = _config(write_config, tmp_path, manifest)
    summary = build_split_cache(Layout(config), "train")
    cached = read_cache(Path(summary.cache), config.features)
    reader = cached.reader()
    assert list(cached.lengths) == sorted(cached.lengths)  # the cache is in length order
    for path, text in rows:
        index = cached.paths.index(str(path))
        signal, rate = soundfile.read(path, dtype="int16")
        expected = mfcc(signal, samplerate=rate, numcep=26)
        np.testing.assert_allclose(reader.utterance(index), expected, rtol=1e-5, atol=1e-4)
        assert cached.transcripts[index] == text
        assert cached.durations[index] == pytest.approx(len(signal) / rate)


def test_changed_feature_setting_makes_reader_refuse_old_cache(write_config, tmp_path):
    manifest = write_manifest(tmp_path / "one.csv", [(str(p), t) for p, t in sample_rows(count=1)])
    config = _config(write_config, tmp_path, manifest)
    summary = build_split_cache(Layout(config), "train")
    changed = FeaturesConfig(frontend=MfccSettings(numcep=13, winlen=0.032))
    with pytest.raises(
        CacheError, match=r"numcep: cache 26 vs config 13.*winlen: cache 0\.025 vs config 0\.032"
    ):
        check_settings(Path(summary.cache), changed)
    with pytest.raises(CacheError, match="does not exist"):
        read_cache(tmp_path / "nothing.h5", changed)


def test_context_windows_and_ctc_minimum():
    frames = np.arange(12, dtype=np.float32).reshape(4, 3)
    windows = context_windows(frames, 1)
    assert windows.shape == (4, 3, 3)
    np.testing.assert_array_equal(windows[0, 0], 0)
    np.testing.assert_array_equal(windows[0, 1], frames[0])
    np.testing.assert_array_equal(windows[3, 2], 0)
    np.testing.assert_array_equal(windows[1], frames[0:3])
    assert ctc_min_frames([1, 1, 2, 2, 2, 3]) == 9


_KILLABLE = """
import sys
from pipeline.config_loader import load_config
from pipeline.stages.features import build_split_cache
from pipeline.layout import Layout
if __name__ == "__main__":
    build_split_cache(Layout(load_config(sys.argv[1])), "train")
"""


def test_killed_run_resumes_and_matches_an_uninterrupted_run(write_config, tmp_path):
    base = (
        f"extends: {ROOT / 'configs' / 'sample.yaml'}\ndata:\n  limit_train: 320\nfeatures:\n  workers: 1\n"
        f"augment:\n  speed_factors: []\n"
    )
    killed = write_config(base + f"paths:\n  work_dir: {tmp_path / 'killed'}\n", "killed.yaml")
    clean = write_config(base + f"paths:\n  work_dir: {tmp_path / 'clean'}\n", "clean.yaml")
    config = load_config(killed)
    cache = Layout(config).features_cache("train")
    parts = Layout(config).features_parts("train")
    script = tmp_path / "run.py"
    script.write_text(_KILLABLE)
    process = subprocess.Popen([sys.executable, str(script), str(killed)], cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(parts.glob("*.npz"))) < 3 and process.poll() is None:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    finished_parts = len(list(parts.glob("*.npz")))
    assert 3 <= finished_parts < 10, "the run was not killed half-way"
    assert not cache.exists()

    build_split_cache(Layout(config), "train")
    build_split_cache(Layout(load_config(clean)), "train")
    with h5py.File(cache) as a, h5py.File(Layout(load_config(clean)).features_cache("train")) as b:
        for name in ("features", "offsets", "lengths", "durations"):
            np.testing.assert_array_equal(a[name][...], b[name][...])
        assert list(a["transcripts"][...]) == list(b["transcripts"][...])
    assert not parts.exists()


@pytest.mark.parametrize(
    "name, settings",
    [("mfcc", {}), ("logfbank", {"nfilt": 40, "highfreq": 7000.0}), ("tests.plugins.band_energies", {"bands": 8})],
)
def test_every_front_end_streams_frame_for_frame_what_it_computes_whole(name, settings):
    from native_client.frontends import frontend_class

    cls = frontend_class(name)
    frontend = cls(cls.Settings(**settings), 16000)
    samples, _ = soundfile.read(sample_rows(count=1)[0][0], dtype="int16")
    whole = frontend.frames(samples)
    assert whole.shape == (frontend.frame_count(len(samples)), frontend.feature_size) and whole.dtype == np.float32
    rng = np.random.default_rng(3)
    for _ in range(3):
        stream, pieces, start = frontend.stream(), [], 0
        while start < len(samples):
            size = int(rng.integers(1, 2000))
            pieces.append(stream.feed(samples[start : start + size]))
            start += size
        pieces.append(stream.finish())
        np.testing.assert_array_equal(np.concatenate(pieces), whole)
