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
from native_client.windows import context_windows
from pipeline.config import FeaturesConfig
from pipeline.config_loader import load_config
from pipeline.data.manifests import CorpusError, read_manifests
from pipeline.data.text import TextSettings
from pipeline.features.cache import CacheError, check_settings, read_cache
from pipeline.features.extract import FeaturesError
from pipeline.features.shards import too_short_for_transcript
from pipeline.layout import Layout
from pipeline.model.objectives.ctc import ctc_min_frames
from pipeline.stages.features import features_stage
from tests.conftest import ALPHABET, ROOT, SAMPLE, run_with_peak_rss
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


# Audio of another rate and multi-channel audio are converted by default: these rejects are asked for.
NO_CONVERSION = "features:\n          resample: false\n          downmix: false"


def test_bad_corpus_rejects_exactly_the_bad_rows(write_config, tmp_path):
    manifest, expected = bad_corpus(tmp_path / "corpus")
    config = _config(write_config, tmp_path, manifest, NO_CONVERSION)
    summary = features_stage(Layout(config), "train")
    assert summary.kept == 3
    with open(summary.rejects_report, newline="") as handle:
        rejects = {Path(row["wav_filename"]).name: row for row in csv.DictReader(handle)}
    assert {name: row["reason"] for name, row in rejects.items()} == expected
    assert "'é'" in rejects["accents.flac"]["detail"] and "'ï'" in rejects["accents.flac"]["detail"]
    assert "bad.csv:" in rejects["stereo.wav"]["source"]
    assert "8000 Hz" in rejects["rate8k.wav"]["detail"]
    cached = read_cache(Path(summary.cache), config.features)
    assert sorted(Path(p).name for p in cached.paths) == ["good0.flac", "good1.flac", "good2.flac"]


def test_resample_and_downmix_by_default_keep_those_rows_and_count_them(write_config, tmp_path):
    """features.resample and features.downmix are true by default (issue 37): the 8 kHz file and the
    stereo file are kept, and the summary counts them, also when it comes from the finished cache."""
    manifest, expected = bad_corpus(tmp_path / "corpus")
    config = _config(write_config, tmp_path, manifest)
    summary = features_stage(Layout(config), "train")
    assert summary.kept == 5
    assert "wrong_sample_rate" not in summary.reasons and "too_many_channels" not in summary.reasons
    assert (summary.resampled, summary.downmixed) == (1, 1)
    again = features_stage(Layout(config), "train")
    assert (again.kept, again.resampled, again.downmixed) == (5, 1, 1)


def test_too_many_rejects_fail_naming_split_and_reasons(write_config, tmp_path):
    manifest, _ = bad_corpus(tmp_path / "corpus")
    config = _config(write_config, tmp_path, manifest, NO_CONVERSION)
    config = load_config(
        write_config(
            Path(config.source).read_text().replace("max_reject_fraction: 1.0", "max_reject_fraction: 0.05"),
            "strict.yaml",
        )
    )
    with pytest.raises(CorpusError, match=r"split 'train': 9 of 12 rows rejected .*top reasons: ") as error:
        features_stage(Layout(config), "train")
    assert "rejects.csv" in str(error.value)
    assert not Layout(config).features_cache("train").exists()
    assert Layout(config).rejects_report("train").exists()


def test_raising_max_reject_fraction_reuses_the_extracted_shards(write_config, tmp_path, monkeypatch, caplog):
    import pipeline.features.extract as featurize

    manifest, _ = bad_corpus(tmp_path / "corpus")
    lenient = _config(write_config, tmp_path, manifest, NO_CONVERSION)
    strict = load_config(
        write_config(
            Path(lenient.source).read_text().replace("max_reject_fraction: 1.0", "max_reject_fraction: 0.05"),
            "strict.yaml",
        )
    )
    assert Layout(strict).features_fingerprint("train") == Layout(lenient).features_fingerprint("train")
    with pytest.raises(CorpusError):
        features_stage(Layout(strict), "train")
    parts = sorted(Layout(strict).features_parts("train").glob("*.npz"))
    assert parts
    parts[0].write_bytes(parts[0].read_bytes()[:100])  # a damaged shard is recomputed, with a warning
    computed = []
    real = featurize.process_shard
    monkeypatch.setattr(
        featurize, "process_shard", lambda part, *args: computed.append(part) or real(part, *args)
    )
    summary = features_stage(Layout(lenient), "train")
    assert summary.kept == 3 and computed == [str(parts[0])]
    assert any(str(parts[0]) in r.message and "damaged" in r.message for r in caplog.records)


def test_max_duration_rejects_long_utterances_as_too_long(write_config, tmp_path):
    rows = sample_rows(count=4)
    manifest = write_manifest(tmp_path / "four.csv", [(str(path), text) for path, text in rows])
    durations = [soundfile.info(str(path)).duration for path, _ in rows]
    limit = sorted(durations)[1] + 0.01
    config = _config(write_config, tmp_path, manifest, f"  max_duration_s: {limit}")
    summary = features_stage(Layout(config), "train")
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
    summary = features_stage(Layout(config), "train")
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
    summary = features_stage(Layout(config), "train")
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


def test_too_short_for_transcript_refuses_fewer_frames_than_ctc_needs():
    assert too_short_for_transcript(9, 9, 0.18) == ""
    assert too_short_for_transcript(8, 9, 0.16) == (
        "transcript needs at least 9 time steps, audio gives 8 (0.16 s)"
    )


_KILLABLE = """
import sys
from pipeline.config_loader import load_config
from pipeline.features.extract import FeaturesError
from pipeline.stages.features import features_stage
from pipeline.layout import Layout
if __name__ == "__main__":
    features_stage(Layout(load_config(sys.argv[1])), "train")
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

    features_stage(Layout(config), "train")
    features_stage(Layout(load_config(clean)), "train")
    with h5py.File(cache) as a, h5py.File(Layout(load_config(clean)).features_cache("train")) as b:
        for name in ("features", "offsets", "lengths", "durations"):
            np.testing.assert_array_equal(a[name][...], b[name][...])
        assert list(a["transcripts"][...]) == list(b["transcripts"][...])
    assert not parts.exists()


@pytest.mark.parametrize(
    "name, settings",
    [
        ("mfcc", {}),
        ("logfbank", {"nfilt": 40, "highfreq": 7000.0}),
        ("deepspeech", {}),
        ("deepspeech", {"final_window": True}),
        ("tests.plugins.band_energies", {"bands": 8}),
    ],
)
def test_every_front_end_streams_frame_for_frame_what_it_computes_whole(name, settings):
    from native_client.frontends import frontend_class

    cls = frontend_class(name)
    frontend = cls(cls.Settings(**settings), 16000)
    samples, _ = soundfile.read(sample_rows(count=1)[0][0], dtype="int16")
    whole = frontend.frames(samples)
    assert (
        whole.shape == (frontend.frame_count(len(samples)), frontend.feature_size)
        and whole.dtype == np.float32
    )
    rng = np.random.default_rng(3)
    for _ in range(3):
        stream, pieces, start = frontend.stream(), [], 0
        while start < len(samples):
            size = int(rng.integers(1, 2000))
            pieces.append(stream.feed(samples[start : start + size]))
            start += size
        pieces.append(stream.finish())
        np.testing.assert_array_equal(np.concatenate(pieces), whole)


def _copied_corpus(folder: Path, count: int) -> tuple[Path, list[Path]]:
    """``count`` sample rows with their audio copied into ``folder`` (so a test may remove files)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows, files = [], []
    for index, (audio, transcript) in enumerate(sample_rows(count=count)):
        name = f"{index:03d}{audio.suffix}"
        (folder / name).write_bytes(audio.read_bytes())
        rows.append((name, transcript))
        files.append(folder / name)
    return write_manifest(folder / "corpus.csv", rows), files


def _cache_by_path(cache: Path) -> dict[str, np.ndarray]:
    with h5py.File(cache) as h5:
        offsets, lengths, features = h5["offsets"][...], h5["lengths"][...], h5["features"][...]
        paths = [p.decode() for p in h5["paths"][...]]
    return {path: features[o : o + n] for path, o, n in zip(paths, offsets, lengths, strict=True)}


@pytest.mark.parametrize("rows, missing", [(70, (3, 10, 20, 33, 45, 60)), (40, (1, 5, 9, 13, 17, 21))])
def test_parts_of_a_failed_run_are_never_paired_with_other_rows(write_config, tmp_path, rows, missing):
    """Issue 26 H1: with files missing, a failed run's shard parts hold other rows than a run after the
    files are back; they were reused by position (70 rows: 63 cached rows held another file's features;
    40 rows: the grown last shard failed every rerun with IndexError). A part now carries a digest of
    its rows: the rerun's cache equals a clean build, row by row."""
    manifest, files = _copied_corpus(tmp_path / "corpus", rows)
    saved = {index: files[index].read_bytes() for index in missing}
    for index in missing:
        files[index].unlink()
    text = Path(_config(write_config, tmp_path, manifest).source).read_text()
    strict = text.replace("max_reject_fraction: 1.0", "max_reject_fraction: 0.05")
    config = load_config(write_config(strict, "s.yaml"))
    with pytest.raises(CorpusError, match=r"6 of \d+ rows rejected"):
        features_stage(Layout(config), "train")
    assert list(Layout(config).features_parts("train").glob("*.npz"))  # kept for a rerun
    for index, data in saved.items():
        files[index].write_bytes(data)
    summary = features_stage(Layout(config), "train")
    assert summary.kept == rows
    clean = load_config(
        write_config(
            Path(config.source).read_text().replace(str(tmp_path / "work"), str(tmp_path / "clean")),
            "clean.yaml",
        )
    )
    rerun = _cache_by_path(Path(summary.cache))
    fresh = _cache_by_path(Path(features_stage(Layout(clean), "train").cache))
    assert sorted(rerun) == sorted(fresh) and len(rerun) == rows
    for path, features in fresh.items():
        np.testing.assert_array_equal(rerun[path], features, err_msg=path)


def test_augmented_copies_do_not_dilute_max_reject_fraction(write_config, tmp_path):
    """Issue 26 M3: with two speed copies per row, 2 missing files of 20 rows (10%) passed a 5% limit
    (2 of 56 entries); the fraction now counts manifest rows."""
    manifest, files = _copied_corpus(tmp_path / "corpus", 20)
    files[4].unlink()
    files[11].unlink()
    config = _config(write_config, tmp_path, manifest, "augment:\n          speed_factors: [0.9, 1.1]")
    config = load_config(
        write_config(
            Path(config.source).read_text().replace("max_reject_fraction: 1.0", "max_reject_fraction: 0.05"),
            "s.yaml",
        )
    )
    with pytest.raises(CorpusError, match=r"split 'train': 2 of 20 rows rejected \(10\.0% > "):
        features_stage(Layout(config), "train")


def test_a_split_whose_rows_are_all_rejected_is_an_error(write_config, tmp_path):
    """Issue 26 N3: with every row rejected and max_reject_fraction 1.0, Features wrote an empty cache;
    Evaluate then scored WER 0 and training crashed. Features now fails naming the split and the reasons,
    and a reader refuses an empty cache (one written before this check) naming it."""
    from pipeline.features.cache import CacheWriter

    manifest, files = _copied_corpus(tmp_path / "corpus", 5)
    for file in files:
        file.unlink()
    config = _config(write_config, tmp_path, manifest)
    with pytest.raises(CorpusError) as error:
        features_stage(Layout(config), "train")
    message = str(error.value)
    assert "\n" not in message and "split 'train': no usable rows, all 5 rejected" in message
    assert "missing_file (5)" in message and "rejects.csv" in message
    cache = Layout(config).features_cache("train")
    assert not cache.exists()
    empty = np.zeros(0)
    with CacheWriter(cache, "x", config.features, empty, [], [], [], empty):
        pass
    with pytest.raises(CacheError, match=r"holds no utterance .*run the Features task again"):
        read_cache(cache, config.features)


def test_a_manifest_edited_after_scheduling_is_refused(write_config, tmp_path):
    """Issue 26 M7: the cache is named by the manifest's digest when the run is scheduled; a manifest
    edited before Features reads it gave a cache named by the old digest holding the new rows. Features
    now digests the manifest it reads and refuses a mismatch, naming the file."""
    manifest, _ = _copied_corpus(tmp_path / "corpus", 6)
    layout = Layout(_config(write_config, tmp_path, manifest))
    scheduled = layout.features_cache("train")  # what the scheduler's complete() asks
    lines = manifest.read_text().splitlines(keepends=True)
    manifest.write_text("".join(lines[:-2]))
    with pytest.raises(FeaturesError, match=rf"{manifest}: the manifest changed after this run was schedul"):
        features_stage(layout, "train")
    assert not scheduled.exists()
    assert features_stage(Layout(layout.config), "train").kept == 4  # a new schedule reads the new rows


def test_a_linked_manifest_finds_its_audio_beside_its_real_file(write_config, tmp_path):
    """Issue 26 N10: a manifest reached through a symbolic link resolved relative audio paths from the
    link's folder (every row missing_file); the rule is the real file's folder, as for configs."""
    manifest, _ = _copied_corpus(tmp_path / "corpus", 3)
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "linked.csv"
    link.symlink_to(manifest)
    samples, rejects = read_manifests([link], 0, load_alphabet(ALPHABET), TextSettings())
    assert len(samples) == 3 and not rejects


_FEATURISE_ONE = """
import sys
from pipeline.config import FeaturesConfig
from pipeline.features.shards import process_shard
count, rejected, seconds = process_shard(sys.argv[2], [(sys.argv[1], 1)], FeaturesConfig(), 0.0)
print(rejected, round(seconds))
"""


@pytest.mark.slow
def test_a_long_file_is_featurised_in_bounded_memory(tmp_path):
    """Issue 26 N9: one long file's features were computed whole (a 1-hour WAV peaked at 5.8 GB with
    max_duration_s 0: the windows of the whole signal as float64); the audio is now read and featurised
    in blocks. A 20-minute file may need at most 100 MB more than a 10-second one: its frames (26 floats
    per 10 ms, 12.5 MB) in a few copies while they are joined, normalised and saved; the 1-hour file
    took 218 MB against 138 MB for 10 s."""
    clip, rate = soundfile.read(SAMPLE / "test" / "00003.flac", dtype="int16")
    short, long_ = tmp_path / "short.wav", tmp_path / "long.wav"
    soundfile.write(short, np.tile(clip, int(np.ceil(10 * rate / len(clip))))[: 10 * rate], rate)
    with soundfile.SoundFile(long_, "w", rate, 1, subtype="PCM_16") as sink:
        written = 0
        while written < 20 * 60 * rate:
            sink.write(clip)
            written += len(clip)
    script = tmp_path / "one.py"
    script.write_text(_FEATURISE_ONE)
    peaks = {}
    for audio in (short, long_):
        result, peaks[audio.name] = run_with_peak_rss(
            [sys.executable, str(script), str(audio), str(tmp_path / "part.npz")],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        out, err = result.stdout, result.stderr
        assert result.returncode == 0 and out.split()[0] == "0", err[-2000:]
    assert int(out.split()[1]) >= 1200
    assert peaks["long.wav"] - peaks["short.wav"] < 100, peaks
