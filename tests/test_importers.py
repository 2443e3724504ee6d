"""Corpus importers (issue 22): each importer on a miniature corpus in its exact layout, checked row
by row through the import runner (manifests, rejects, report), plus splits, fingerprints and the
once-only conversion of audio libsndfile cannot read."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from pipeline.data.importers import CorpusLayoutError, importer
from pipeline.data.importing import CorpusSpec, import_corpus, import_fingerprint, plan_import
from pipeline.layout import Layout
from tests import corpus_layouts

SPLITS = ("train", "dev", "test")


def run(tmp_path, name, path, **spec):
    """Import and return (report, {split: [(file name, transcript, offset, duration, speaker)]},
    [(reason, source relative to tmp_path)])."""
    plan = plan_import(CorpusSpec(name, path, **spec))
    out = tmp_path / "import" / name
    report = import_corpus(plan, out, tmp_path / "converted")
    rows = {}
    for split in SPLITS:
        with open(out / f"{split}.csv", newline="", encoding="utf-8") as handle:
            rows[split] = [
                (Path(r["wav_filename"]).name, r["transcript"], r["offset"], r["duration"], r["speaker"])
                for r in csv.DictReader(handle)
            ]
    with open(out / "rejects.csv", newline="", encoding="utf-8") as handle:
        rejects = [
            (r["reason"], r["source"].replace(str(tmp_path) + "/", "")) for r in csv.DictReader(handle)
        ]
    assert json.loads((out / "report.json").read_text()) == report
    return report, rows, rejects


def test_librispeech(tmp_path):
    path = corpus_layouts.librispeech(tmp_path / "corpus")
    report, rows, rejects = run(tmp_path, "librispeech", path)
    assert rows == {
        "train": [
            ("19-198-0000.flac", "hello world", "", "", "19"),
            ("19-198-0001.flac", "a second line", "", "", "19"),
        ],
        "dev": [("84-121123-0000.flac", "dev speech", "", "", "84")],
        "test": [
            ("1089-134686-0000.flac", "test speech", "", "", "1089"),
            ("1089-134686-0001.flac", "more test", "", "", "1089"),
        ],
    }
    assert rejects == [
        ("missing_file", "corpus/LibriSpeech/train-clean-100/26/495/26-495.trans.txt:1"),
        ("missing_transcript", "corpus/LibriSpeech/train-clean-100/26/500"),
    ]
    assert report["split_method"] == "official"
    assert report["parts"] == {"train": ["train-clean-100"], "dev": ["dev-clean"], "test": ["test-clean"]}
    assert report["splits"]["train"] == {"utterances": 2, "hours": round(2.1 / 3600, 6), "speakers": 1}
    assert report["dropped_by_reason"] == {"missing_file": 1, "missing_transcript": 1}
    manifest = tmp_path / "import" / "librispeech" / "train.csv"
    first = next(csv.DictReader(open(manifest)))
    audio = Path(first["wav_filename"])
    assert audio.is_absolute() and int(first["wav_filesize"]) == audio.stat().st_size


def test_librispeech_parts_named_in_the_config(tmp_path):
    path = corpus_layouts.librispeech(tmp_path / "corpus") / "LibriSpeech"
    _, rows, _ = run(
        tmp_path, "librispeech", path, splits={"train": ("test-clean",), "dev": (), "test": ("dev-clean",)}
    )
    assert [r[0] for r in rows["train"]] == ["1089-134686-0000.flac", "1089-134686-0001.flac"]
    assert rows["dev"] == [] and [r[0] for r in rows["test"]] == ["84-121123-0000.flac"]
    with pytest.raises(
        CorpusLayoutError, match="part\\(s\\) train-other-500 not found; found: dev-clean, test-clean"
    ):
        plan_import(CorpusSpec("librispeech", path, splits={"train": ("train-other-500",)}))
    with pytest.raises(ValueError, match="part 'dev-clean' is in both train and dev: a split leak"):
        plan_import(CorpusSpec("librispeech", path, splits={"train": ("dev-clean",)}))


def test_multilingual_librispeech_opus(tmp_path):
    path = corpus_layouts.mls(tmp_path)
    report, rows, rejects = run(tmp_path, "mls", path)
    assert rows == {
        "train": [
            ("10065_10082_000001.opus", "bonjour à tous", "", "", "10065"),
            ("10087_10082_000002.opus", "une deuxième phrase", "", "", "10087"),
        ],
        "dev": [("1591_1127_000003.opus", "le développement", "", "", "1591")],
        "test": [("1713_1127_000004.opus", "un essai", "", "", "1713")],
    }
    assert rejects == [] and report["kept"] == 4


@pytest.mark.parametrize("header", [corpus_layouts.CV_HEADER_V4, corpus_layouts.CV_HEADER_V17])
def test_common_voice_official_splits_and_the_traps_of_real_releases(tmp_path, header):
    """v4 and v17 TSV columns; quotes and commas, an unbalanced quote, a CSV-quoted field, an NFD
    sentence, a BOM, a missing clip, a 0-byte clip, an empty sentence, a row with too many fields."""
    path, expected = corpus_layouts.common_voice(tmp_path / "cv", header)
    report, rows, rejects = run(tmp_path, "common_voice", path)
    kept = {clip: text for split in SPLITS for clip, text, *_ in rows[split]}
    assert kept == {clip: outcome for clip, outcome in expected.items() if " " in outcome}
    assert [(reason, source.rsplit("/", 1)[1]) for reason, source in rejects] == [
        ("missing_file", "train.tsv:7"),
        ("empty_audio", "train.tsv:8"),
        ("empty_transcript", "train.tsv:9"),
        ("malformed_row", "train.tsv:10"),
    ]
    assert [r[4] for r in rows["train"]] == ["spk_a", "spk_a", "spk_b", "spk_b", "spk_b"]
    assert report["splits"]["train"]["speakers"] == 2 and report["speakers_in_several_splits"] == {}
    assert (
        plan_import(CorpusSpec("common_voice", path.parent)).root == path
    )  # the release folder of one language


def test_common_voice_validated_holds_out_dev_and_test_speakers(tmp_path):
    path, _ = corpus_layouts.common_voice(tmp_path / "cv")
    report, rows, rejects = run(tmp_path, "common_voice", path, options={"train_from_validated": True})
    assert [(r[0], r[4]) for r in rows["train"]] == [("a1.mp3", "spk_a"), ("g1.mp3", "spk_g")]
    assert [reason for reason, _ in rejects] == ["held_out_speaker", "held_out_speaker"]
    assert report["parts"]["train"] == ["validated"] and report["speakers_in_several_splits"] == {}


def test_common_voice_without_a_needed_column_is_named(tmp_path):
    path, _ = corpus_layouts.common_voice(tmp_path / "cv")
    text = (path / "test.tsv").read_text().replace("sentence\t", "text\t", 1)
    (path / "test.tsv").write_text(text)
    with pytest.raises(CorpusLayoutError, match=r"test.tsv:1: no column\(s\) sentence in the header"):
        import_corpus(plan_import(CorpusSpec("common_voice", path)), tmp_path / "out")
    assert not (tmp_path / "out" / "report.json").exists() and not (tmp_path / "out" / "train.csv").exists()


def test_tedlium_segments(tmp_path):
    path = corpus_layouts.tedlium(tmp_path)
    report, rows, rejects = run(tmp_path, "tedlium", path)
    assert rows["train"] == [
        ("Speaker0_2010X.sph", "it's a good day", "0", "1.5", "Speaker0_2010X"),
        ("Speaker0_2010X.sph", "they're back in the '60s", "3.2", "1.2", "Speaker0_2010X"),
    ]
    assert [r[0] for r in rows["dev"]] == ["Speaker1_2010X.sph"] * 2
    stm = "TEDLIUM_release-3/legacy/train/stm/Speaker0_2010X.stm"
    assert rejects[:3] == [
        ("ignored_segment", f"{stm}:3"),
        ("unknown_word", f"{stm}:4"),
        ("segment_out_of_range", f"{stm}:6"),
    ]
    assert report["parts"] == {"train": ["legacy/train"], "dev": ["legacy/dev"], "test": ["legacy/test"]}
    _, rows, _ = run(tmp_path / "remove", "tedlium", path, options={"unk": "remove"})
    assert rows["train"][1] == ("Speaker0_2010X.sph", "we don't know the here", "2", "1.2", "Speaker0_2010X")


def test_tedlium_segments_reach_features_as_segments(tmp_path, write_config):
    """The offset/duration columns travel to Features: the cached utterances have the segments'
    lengths (1.5 s and 1.2 s of a 5 s talk), not the talk's."""
    from pipeline.config_loader import load_config
    from pipeline.features.cache import read_cache
    from pipeline.stages.features import features_stage
    from tests.conftest import ALPHABET

    path = corpus_layouts.tedlium(tmp_path)
    import_corpus(plan_import(CorpusSpec("tedlium", path, options={"unk": "remove"})), tmp_path / "import")
    config = load_config(
        write_config(f"""
        paths:
          work_dir: {tmp_path / "work"}
          alphabet: {ALPHABET}
        data:
          train_files: [{tmp_path / "import" / "train.csv"}]
          max_reject_fraction: 0.5
        features:
          workers: 1
    """)
    )
    summary = features_stage(Layout(config), "train")
    assert (summary.kept, summary.reasons) == (2, {"unknown_characters": 1})  # the digits of '60s
    cache = read_cache(Path(summary.cache), config.features)
    assert np.allclose(sorted(cache.durations), [1.2, 1.5])
    assert sorted(cache.transcripts) == ["it's a good day", "we don't know the here"]
    assert sorted(cache.lengths.tolist())[0] < 125 < sorted(cache.lengths.tolist())[1] < 155


def test_timit(tmp_path):
    path = corpus_layouts.timit(tmp_path)
    report, rows, rejects = run(tmp_path, "timit", path)
    assert rows == {
        "train": [("SX4.WAV", "don't ask me", "", "", "fcjf0")],
        "dev": [("SX4.WAV", "don't ask me", "", "", "fadg0")],
        "test": [("SX4.WAV", "don't ask me", "", "", "mdab0")],
    }
    assert [reason for reason, _ in rejects] == ["dialect_sentence"] * 3
    _, rows, _ = run(
        tmp_path / "lower",
        "timit",
        corpus_layouts.timit(tmp_path / "lower", lower=True),
        options={"include_sa": True},
    )
    assert [r[:2] for r in rows["train"]] == [
        ("sa1.wav", "she had your dark suit in greasy wash water all year"),
        ("sx4.wav", "don't ask me"),
    ]
    _, rows, _ = run(
        tmp_path / "wrd", "timit", path, options={"transcript": "wrd"}, splits={"test": ("test",), "dev": ()}
    )
    assert [r[4] for r in rows["test"]] == ["fadg0", "mdab0", "mrjo0"]


def test_mailabs(tmp_path):
    path = corpus_layouts.mailabs(tmp_path)
    report, rows, rejects = run(tmp_path, "mailabs", path, fractions={"train": 1.0})
    assert rows["train"] == [
        ("ec_01_f000001.wav", "chapter one", "", "", "judy_bieber"),
        ("ec_01_f000002.wav", "it was three o'clock", "", "", "judy_bieber"),
        ("oz_01_f000001.wav", "ozma of oz", "", "", "judy_bieber"),
        ("pf_01_f000001.wav", "the pink fairy", "", "", "elliot_miller"),
        ("mb_01_f000001.wav", "many voices", "", "", "mix/mixed_book"),
    ]
    assert rejects == [("missing_file", "en_US/by_book/male/elliot_miller/pink_fairy/metadata.csv:2")]
    assert report["split_method"] == "speaker_hash"
    _, rows, _ = run(
        tmp_path / "orig", "mailabs", path, fractions={"train": 1.0}, options={"text_column": "original"}
    )
    assert rows["train"][1][1] == "it was 3 o'clock"


def test_kaldi_data_dir(tmp_path):
    path = corpus_layouts.kaldi(tmp_path)
    report, rows, rejects = run(tmp_path, "kaldi", path, fractions={"train": 1.0})
    assert rows["train"] == [
        ("rec1.wav", "first segment", "0", "1.5", "spk1"),
        ("rec1.wav", "second segment", "1.5", "2.5", "spk1"),
        ("rec2.flac", "from the flac", "0.5", "2", "spk2"),
    ]
    assert rejects == [("piped_command", "data/train/wav.scp:3")]
    assert not (tmp_path / "converted").exists()


def test_kaldi_commands_run_once_when_allowed(tmp_path):
    """run_commands: the sox speed-perturbation pipe runs once, its output is kept and reused."""
    if shutil.which("sox") is None:
        pytest.skip("sox is not installed: apt-get install sox (make test does, run as root)")
    path = corpus_layouts.kaldi(tmp_path)
    _, rows, rejects = run(tmp_path, "kaldi", path, fractions={"train": 1.0}, options={"run_commands": True})
    assert rejects == [] and rows["train"][3][1:] == ("faster", "0", "1", "spk2")
    made = list((tmp_path / "converted").iterdir())
    assert len(made) == 1 and abs(soundfile.info(made[0]).duration - 4.0 / 1.1) < 0.01
    stamp = made[0].stat().st_mtime_ns
    run(tmp_path, "kaldi", path, fractions={"train": 1.0}, options={"run_commands": True})
    assert [p.stat().st_mtime_ns for p in (tmp_path / "converted").iterdir()] == [stamp]


def test_kaldi_unsorted_text_is_named(tmp_path):
    path = corpus_layouts.kaldi(tmp_path)
    lines = (path / "text").read_text().splitlines()
    (path / "text").write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
    with pytest.raises(
        CorpusLayoutError, match=r"text:2: 'spk1-rec1-a' comes after 'spk1-rec1-b'.*not sorted"
    ):
        import_corpus(plan_import(CorpusSpec("kaldi", path)), tmp_path / "out")


def test_folder_and_a_format_converted_once(tmp_path):
    """A WavPack file (libsndfile cannot read it) is converted once by sox, and only once."""
    path = corpus_layouts.folder(tmp_path)
    if shutil.which("sox") is None:
        pytest.skip("sox is not installed: apt-get install sox (make test does, run as root)")
    import subprocess

    subprocess.run(["sox", str(path / "alice" / "001.wav"), str(path / "carol.wv")], check=True)
    (path / "carol.txt").write_text("Packed words")
    report, rows, rejects = run(tmp_path, "folder", path, fractions={"train": 1.0})
    assert [r[1:] for r in rows["train"]] == [
        ("hello there", "", "", "alice"),
        ("general kenobi", "", "", "alice"),
        ("bob speaks", "", "", "bob"),
        ("packed words", "", "", "carol"),
    ]
    converted = tmp_path / "converted"
    assert rows["train"][3][0].endswith(".flac") and [p.name for p in converted.iterdir()] == [
        rows["train"][3][0]
    ]
    assert rejects == [("missing_transcript", "recordings/bob/002.wav")]
    assert report["converted_audio_files"] == 1
    stamp = next(converted.iterdir()).stat().st_mtime_ns
    run(tmp_path, "folder", path, fractions={"train": 1.0})
    assert next(converted.iterdir()).stat().st_mtime_ns == stamp


def test_speaker_hash_splits_never_share_a_speaker(tmp_path):
    """A corpus without official splits is split by speaker: every speaker's utterances in one split,
    the shares near the fractions, the same result on a second import."""
    path = corpus_layouts.folder(tmp_path, speakers=120)
    for extra in range(120):  # a second utterance per speaker
        corpus_layouts.tone(path / f"speaker{extra:03d}" / "b.wav", 0.2, 500, subtype="PCM_16")
        (path / f"speaker{extra:03d}" / "b.txt").write_text("another one")
    fractions = {"train": 0.6, "dev": 0.2, "test": 0.2}
    report, rows, _ = run(tmp_path, "folder", path, fractions=fractions)
    speakers = {split: {r[4] for r in rows[split]} for split in SPLITS}
    for first in SPLITS:
        for second in SPLITS:
            if first < second:
                assert not speakers[first] & speakers[second], (first, second)
    assert report["speakers_in_several_splits"] == {}
    assert sum(len(s) for s in speakers.values()) == 122
    assert all(abs(len(speakers[s]) / 122 - fractions[s]) < 0.15 for s in SPLITS)
    again, rows_again, _ = run(tmp_path / "again", "folder", path, fractions=fractions)
    assert rows_again == rows


def test_speakers_shared_by_official_splits_are_reported(tmp_path, caplog):
    """A speaker whose recordings the corpus puts in two official splits is reported as a leak."""
    base = tmp_path / "recordings"
    for split, frequency in (("train", 300), ("test", 400)):
        corpus_layouts.tone(base / split / "alice" / "1.wav", 1.0, frequency, subtype="PCM_16")
        (base / split / "alice" / "1.txt").write_text("hello")
    report, _, _ = run(tmp_path, "folder", base)
    assert report["speakers_in_several_splits"] == {"train/test": {"speakers": 1, "examples": ["alice"]}}
    assert "the splits leak" in caplog.text


def test_the_same_audio_in_two_official_splits_is_imported_once(tmp_path):
    """TIMIT's ``test`` part holds the dev speakers too: naming both takes their audio once, in the split
    read first (dev); the second row is counted as ``duplicate_audio``, not as a reject, and no speaker
    is in both."""
    path = corpus_layouts.timit(tmp_path)
    report, rows, rejects = run(tmp_path, "timit", path, splits={"dev": ("dev",), "test": ("test",)})
    assert [r[4] for r in rows["dev"]] == ["fadg0"] and "fadg0" not in {r[4] for r in rows["test"]}
    assert ("duplicate_audio", "TIMIT/TEST/DR1/FADG0/SX4.TXT:1") in rejects
    assert report["duplicate_audio"] == 1 and report["rejected_by_split"]["test"] == {}
    assert report["speakers_in_several_splits"] == {}


def test_fingerprint_lists_files_without_opening_them(tmp_path, monkeypatch):
    """The fingerprint changes when a corpus file is added, removed or rewritten (size or modification
    time), and stays when nothing changed; it never opens a file."""
    import builtins

    path = corpus_layouts.librispeech(tmp_path / "corpus")
    plan = plan_import(CorpusSpec("librispeech", path))
    first = import_fingerprint(plan)
    real_open = builtins.open

    def no_reading(*args, **kwargs):
        raise AssertionError(f"the fingerprint opened {args[0]}")

    monkeypatch.setattr(builtins, "open", no_reading)
    monkeypatch.setattr(soundfile, "info", no_reading)
    assert import_fingerprint(plan) == first
    monkeypatch.setattr(builtins, "open", real_open)
    audio = path / "LibriSpeech" / "dev-clean" / "84" / "121123" / "84-121123-0000.flac"
    stat = audio.stat()
    import os

    os.utime(audio, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = import_fingerprint(plan)
    assert second != first
    corpus_layouts.tone(audio.with_name("84-121123-0009.flac"), 0.5, 300)
    assert import_fingerprint(plan) not in (first, second)
    other_text = plan_import(CorpusSpec("librispeech", path, options={}, salt="x"))
    assert import_fingerprint(other_text) == import_fingerprint(plan)  # salt matters only for hash splits


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"importer": "no_such_corpus"},
            "no module 'pipeline.data.importers.no_such_corpus'; built in: common_voice",
        ),
        (
            {"importer": "common_voice", "options": {"train_from_validate": True}},
            "unknown key 'train_from_validate'",
        ),
        ({"importer": "common_voice", "options": {"train_from_validated": "yes"}}, "expected true or false"),
        ({"importer": "tedlium", "options": {"unk": "keep"}}, "unk: 'keep' is not one of drop, remove"),
        ({"importer": "folder", "fractions": {"train": 0.5}}, "fractions add up to 0.5"),
        ({"importer": "folder", "splits": {"valid": ("all",)}}, "unknown split\\(s\\) valid"),
    ],
)
def test_config_mistakes_are_named(tmp_path, spec, message):
    path = corpus_layouts.folder(tmp_path)
    spec.setdefault("importer", "folder")
    with pytest.raises(ValueError, match=message):
        plan_import(CorpusSpec(path=path, **spec), "data.corpora[0]")


def test_every_builtin_importer_is_found_by_name():
    from native_client.plugins import builtin_names

    names = builtin_names("pipeline.data.importers", "IMPORTER")
    assert names == [
        "common_voice",
        "folder",
        "kaldi",
        "librispeech",
        "mailabs",
        "mls",
        "recordings",
        "tedlium",
        "timit",
    ]
    assert all(importer(name).name == name for name in names)
