"""data.corpora in the config and the Import task (issue 22 phase 2): one Import per corpus through Luigi,
fingerprinted by the corpus listing (never its contents), FeaturesSplit on the imports beside data.*_files,
import rejects and data.max_reject_fraction, mistakes in one line, and crashes that leave nothing a rerun
trusts."""

from __future__ import annotations

import builtins
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import luigi
import pytest
import soundfile
import yaml

import pipeline.layout as layout_module
from pipeline.config import ConfigError
from pipeline.config_loader import load_config
from pipeline.data.manifests import CorpusError
from pipeline.layout import Layout, forget_corpus_listings
from pipeline.stages.features import features_stage
from tasks import Evaluate, FeaturesSplit, Import, Imports
from tests import corpus_layouts
from tests.conftest import ALPHABET, ROOT, SAMPLE

pytestmark = pytest.mark.usefixtures("tasks_in_process")
SPLITS = ("train", "dev", "test")


@pytest.fixture(autouse=True)
def fresh_tasks():
    """Each test sees its corpora as they are now: Luigi's task instances (each with its Layout) and the
    process's corpus listings are forgotten before and after it."""
    luigi.task_register.Register.clear_instance_cache()
    forget_corpus_listings()
    yield
    luigi.task_register.Register.clear_instance_cache()
    forget_corpus_listings()


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _config(tmp_path: Path, corpora: list[dict], name: str = "config.yaml", **extra) -> Path:
    """Write a config importing ``corpora`` (YAML from a dict; ``extra``: sections to merge in)."""
    data = {
        "paths": {"work_dir": str(tmp_path / "work"), "alphabet": str(ALPHABET)},
        "data": {"corpora": corpora},
        "features": {"workers": 1},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(_merge(data, extra)))
    return path


def _rows(manifest: Path) -> list[dict]:
    with open(manifest, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_import_writes_manifests_rejects_and_report_and_is_done_once(tmp_path):
    corpus = corpus_layouts.librispeech(tmp_path / "corpus")
    path = _config(tmp_path, [{"importer": "librispeech", "path": str(corpus)}])
    assert luigi.build([Imports(config=str(path))], local_scheduler=True)
    files = Layout(load_config(path)).import_files("librispeech-corpus")
    assert files.root.parent == tmp_path / "work" / "imports" and files.root.name.startswith(
        "librispeech-corpus-"
    )
    report = json.loads(files.report.read_text())
    assert (report["rows"], report["kept"], report["dropped"]) == (7, 5, 2)
    assert report["dropped_by_reason"] == {"missing_file": 1, "missing_transcript": 1}
    assert report["rejected_by_split"] == {
        "train": {"missing_file": 1, "missing_transcript": 1},
        "dev": {},
        "test": {},
    }
    assert report["splits"]["train"] == {"utterances": 2, "hours": round(2.1 / 3600, 6), "speakers": 1}
    assert report["splits"]["test"]["speakers"] == 1
    rejects = _rows(files.rejects)
    assert [(r["reason"], Path(r["source"]).name) for r in rejects] == [
        ("missing_file", "26-495.trans.txt:1"),
        ("missing_transcript", "500"),
    ]
    speakers = {split: {r["speaker"] for r in _rows(files.manifest(split))} for split in SPLITS}
    assert speakers == {"train": {"19"}, "dev": {"84"}, "test": {"1089"}}
    assert [r["transcript"] for r in _rows(files.manifest("test"))] == ["test speech", "more test"]

    stamp = files.report.stat().st_mtime_ns
    assert luigi.build([Import(config=str(path), corpus="librispeech-corpus")], local_scheduler=True)
    assert files.report.stat().st_mtime_ns == stamp  # complete: not imported again


def test_complete_lists_the_corpus_once_and_never_reads_it(tmp_path, monkeypatch):
    """complete() on the whole DAG (every task asks for the Import fingerprint, several times) lists the
    corpus once per process and opens none of its files; a rewritten corpus file (its size or modification
    time) moves the Import to a new folder."""
    from tasks.rerun import dag

    corpus = corpus_layouts.librispeech(tmp_path / "corpus")
    path = _config(tmp_path, [{"importer": "librispeech", "path": str(corpus)}])
    assert luigi.build([Import(config=str(path), corpus="librispeech-corpus")], local_scheduler=True)
    luigi.task_register.Register.clear_instance_cache()
    forget_corpus_listings()

    listings = []
    real_listing, real_open = layout_module.corpus_listing, builtins.open

    def counted(*args):
        listings.append(args[1])
        return real_listing(*args)

    def guarded_open(file, *args, **kwargs):
        if str(corpus) in str(file):
            raise AssertionError(f"complete() opened the corpus file {file}")
        return real_open(file, *args, **kwargs)

    def no_header(*args, **kwargs):
        raise AssertionError(f"complete() read the audio header of {args[0]}")

    monkeypatch.setattr(layout_module, "corpus_listing", counted)
    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(soundfile, "info", no_header)
    tasks = dag([Evaluate(config=str(path))])
    assert {task.task_family for task in tasks.values()} >= {
        "Import",
        "FeaturesSplit",
        "Train",
        "LanguageModel",
    }
    for _ in range(2):
        for task in tasks.values():
            assert task.complete() == (task.task_family == "Import")
            task.output()
    assert len(listings) == 1
    monkeypatch.setattr(builtins, "open", real_open)

    before = Layout(load_config(path)).import_files("librispeech-corpus").root
    audio = corpus / "LibriSpeech" / "dev-clean" / "84" / "121123" / "84-121123-0000.flac"
    stat = audio.stat()
    os.utime(audio, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    forget_corpus_listings()
    luigi.task_register.Register.clear_instance_cache()
    assert not Import(config=str(path), corpus="librispeech-corpus").complete()
    assert Layout(load_config(path)).import_files("librispeech-corpus").root != before


def test_features_read_the_imports_after_data_files_and_fingerprint_them(tmp_path):
    """A train split made of a manifest of data.train_files and an imported corpus, in that order; the
    Features fingerprint moves with the import's (a corpus file changed) and the import's only with
    its own entry and data.text."""
    from tests.corpus_factory import sample_rows, write_manifest

    corpus = corpus_layouts.librispeech_speech(tmp_path / "corpus", {"train": 3, "dev": 2, "test": 2})
    rows = sample_rows("dev", 2)
    manifest = write_manifest(tmp_path / "own.csv", [(str(audio), text) for audio, text in rows])
    entry = {"importer": "librispeech", "path": str(corpus)}
    path = _config(tmp_path, [entry], data={"train_files": [str(manifest)]})
    assert luigi.build([FeaturesSplit(config=str(path), split="train")], local_scheduler=True)
    layout = Layout(load_config(path))
    assert layout.split_manifests("train") == (
        str(manifest),
        str(layout.import_files("librispeech-corpus").manifest("train")),
    )
    summary = features_stage(layout, "train")  # the cache exists: its summary
    assert (summary.kept, summary.rejected) == (5, 0)
    before = layout.features_fingerprint("train")

    folder = tmp_path / "more"
    corpus_layouts.folder(folder)
    other = Layout(
        load_config(_config(tmp_path, [entry, {"importer": "folder", "path": str(folder)}], "two.yaml"))
    )
    assert other.fingerprint("import", corpus="librispeech-corpus") == layout.fingerprint(
        "import", corpus="librispeech-corpus"
    )
    digits = Layout(
        load_config(_config(tmp_path, [entry], "digits.yaml", data={"text": {"digits": "reject"}}))
    )
    assert digits.fingerprint("import", corpus="librispeech-corpus") != layout.fingerprint(
        "import", corpus="librispeech-corpus"
    )
    numcep = Layout(
        load_config(_config(tmp_path, [entry], "numcep.yaml", features={"numcep": 13, "nfilt": 26}))
    )
    assert numcep.fingerprint("import", corpus="librispeech-corpus") == layout.fingerprint(
        "import", corpus="librispeech-corpus"
    )
    assert numcep.features_fingerprint("train") != before

    transcript = next((corpus / "LibriSpeech" / "train-clean-100").rglob("*.trans.txt"))
    transcript.write_text(transcript.read_text() + "\n")
    forget_corpus_listings()
    assert Layout(load_config(path)).features_fingerprint("train") != before


def test_import_rejects_count_towards_max_reject_fraction_and_selections_do_not(tmp_path):
    """LibriSpeech's train split here: 2 rows kept, 2 rejected by the import (a missing FLAC, a chapter
    without transcripts): 50 % rejected, over data.max_reject_fraction 0.05; with data.limit_train the
    import's rejects are not counted; TIMIT's dialect sentences (left out by design) never are."""
    corpus = corpus_layouts.librispeech(tmp_path / "corpus")
    path = _config(tmp_path, [{"importer": "librispeech", "path": str(corpus)}])
    assert luigi.build([Imports(config=str(path))], local_scheduler=True)
    layout = Layout(load_config(path))
    with pytest.raises(CorpusError) as error:
        features_stage(layout, "train")
    message = str(error.value)
    assert "split 'train': 2 of 4 rows rejected (50.0% > data.max_reject_fraction 5.0%)" in message
    assert "missing_file (1)" in message and "missing_transcript (1)" in message
    assert str(layout.import_files("librispeech-corpus").rejects) in message
    assert not layout.features_cache("train").exists()
    raised = Layout(
        load_config(
            _config(
                tmp_path,
                [{"importer": "librispeech", "path": str(corpus)}],
                "raised.yaml",
                data={"max_reject_fraction": 0.5},
            )
        )
    )
    assert raised.features_fingerprint("train") == layout.features_fingerprint("train")
    assert features_stage(raised, "train").kept == 2
    limited = Layout(
        load_config(
            _config(
                tmp_path,
                [{"importer": "librispeech", "path": str(corpus)}],
                "limit.yaml",
                data={"limit_train": 10},
            )
        )
    )
    assert features_stage(limited, "train").kept == 2

    timit = corpus_layouts.timit(tmp_path / "timit")
    path = _config(tmp_path / "timit", [{"importer": "timit", "path": str(timit)}])
    assert luigi.build([FeaturesSplit(config=str(path), split="train")], local_scheduler=True)
    report = json.loads(Layout(load_config(path)).import_files("timit-timit").report.read_text())
    assert report["dropped_by_reason"] == {"dialect_sentence": 3} and report["selected"] == 3
    assert report["rejected_by_split"] == {"train": {}, "dev": {}, "test": {}}


@pytest.mark.parametrize(
    "entries, expected",
    [
        (
            [{"importer": "librispeech", "path": "{corpus}"}, {"importer": "folder"}],
            r"data\.corpora\[1\]\.path: required",
        ),
        (
            [{"importer": "librispech", "path": "{corpus}"}],
            r"data\.corpora\[0\]\.importer: no module .*librispech",
        ),
        (
            [{"importer": "librispeech", "path": "{corpus}", "train": ["train-clean-500"]}],
            r"data\.corpora\[0\]: .*librispeech part\(s\) train-clean-500 not found; found: dev-clean",
        ),
        (
            [{"importer": "librispeech", "path": "{corpus}", "dev": ["test-clean"]}],
            r"data\.corpora\[0\]: part 'test-clean' is in both dev and test: a split leak",
        ),
        (
            [{"importer": "common_voice", "path": "{corpus}", "train_from_validate": True}],
            r"data\.corpora\[0\]: unknown key 'train_from_validate' for this importer",
        ),
        (
            [{"importer": "folder", "path": "{corpus}", "split_fractions": {"train": 0.8}}],
            r"data\.corpora\[0\]\.split_fractions: fractions add up to 0\.8",
        ),
        (
            [{"importer": "folder", "path": "{corpus}", "trian": ["x"], "name": 5}],
            r"data\.corpora\[0\]\.name: expected a string",
        ),
        (
            [{"importer": "folder", "path": "{corpus}"}, {"importer": "folder", "path": "{corpus}"}],
            r"data\.corpora\[1\]: its key 'folder-corpus' is also data\.corpora\[0\]'s",
        ),
        ("{corpus}", r"data\.corpora: expected a list of mappings"),
    ],
)
def test_corpus_mistakes_are_one_line_naming_the_entry(tmp_path, entries, expected):
    corpus = corpus_layouts.librispeech(tmp_path / "corpus")

    def fill(value):
        return str(corpus) if value == "{corpus}" else value

    entries = (
        fill(entries) if isinstance(entries, str) else [{k: fill(v) for k, v in e.items()} for e in entries]
    )
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"data": {"corpora": entries}}))
    with pytest.raises(ConfigError, match=expected) as error:
        load_config(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_data_text_mistakes_are_named(tmp_path):
    for text, expected in [
        ({"case": "upper"}, "data.text.case: 'upper' is not one of lower, keep"),
        ({"cas": "lower"}, "data.text.cas: unknown key; did you mean 'case'?"),
        ({"digits": "hook"}, "data.text.digits_hook: digits is 'hook' but no function is named"),
    ]:
        path = tmp_path / "text.yaml"
        path.write_text(yaml.safe_dump({"data": {"text": text}}))
        with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("?", r"\?")):
            load_config(path)


def test_a_missing_corpus_folder_is_one_line_and_exit_2(tmp_path):
    corpus = corpus_layouts.folder(tmp_path)
    path = _config(
        tmp_path,
        [
            {"importer": "folder", "path": str(corpus)},
            {"importer": "librispeech", "path": str(tmp_path / "LibriSpeech")},
        ],
    )
    load_config(path)  # a folder that is not there yet is left to the checks before a run
    result = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "Evaluate", "--config", str(path), "--local-scheduler"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"data.corpora[1].path: {tmp_path / 'LibriSpeech'} does not exist" in lines[0]
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("name", ["librispeech", "common_voice", "folder"])
def test_templates_load_and_their_placeholders_are_named(name, capsys):
    from tasks.cli import main
    from tasks.preflight import PreflightError, check_inputs

    config = load_config(ROOT / "configs" / f"{name}.yaml")
    assert len(config.data.corpora) == 1 and config.data.corpora[0].importer == name
    with pytest.raises(
        PreflightError, match=r"data\.corpora\[0\]\.path still hold the template's placeholder"
    ):
        check_inputs(config)
    assert main(["--template", name]) == 0
    assert capsys.readouterr().out == (ROOT / "configs" / f"{name}.yaml").read_text()


def test_a_failed_import_leaves_nothing_a_rerun_trusts(tmp_path):
    """An import that fails half-way (Kaldi's text file out of order at its second line) leaves no import
    folder and no staging folder; nor does a killed run's staging folder survive the next run."""
    data = corpus_layouts.kaldi(tmp_path)
    lines = (data / "text").read_text().splitlines()
    (data / "text").write_text("\n".join([lines[0], lines[2], lines[1], lines[3]]) + "\n")
    path = _config(tmp_path, [{"importer": "kaldi", "path": str(data), "split_fractions": {"train": 1.0}}])
    task = Import(config=str(path), corpus="kaldi-train")
    assert not luigi.build([task], local_scheduler=True)
    imports = tmp_path / "work" / "imports"
    assert [p.name for p in imports.iterdir() if not p.name.endswith(".lock")] == []
    killed = imports / f".{task.layout.import_files('kaldi-train').root.name}.staging-999999999"
    (killed / "train.csv").parent.mkdir()
    (killed / "train.csv").write_text("wav_filename,wav_filesize,transcript\n")

    (data / "text").write_text("\n".join(lines) + "\n")
    luigi.task_register.Register.clear_instance_cache()
    forget_corpus_listings()
    assert luigi.build([Import(config=str(path), corpus="kaldi-train")], local_scheduler=True)
    found = sorted(p.name for p in imports.iterdir() if not p.name.endswith(".lock"))
    assert len(found) == 1 and found[0].startswith("kaldi-train-") and not killed.exists()
    files = Layout(load_config(path)).import_files("kaldi-train")
    assert len(_rows(files.manifest("train"))) == 3

    files.manifest("dev").write_text("wav_filename,wav_filesize,transcript\nbroken")  # changed afterwards
    luigi.task_register.Register.clear_instance_cache()
    assert not Import(config=str(path), corpus="kaldi-train").complete()
    assert luigi.build([Import(config=str(path), corpus="kaldi-train")], local_scheduler=True)
    assert (
        files.manifest("dev").read_text().strip()
        == "wav_filename,wav_filesize,transcript,offset,duration,speaker"
    )


def test_rerun_import_removes_the_import_and_what_follows(tmp_path, capsys):
    from tasks.rerun import main

    corpus = corpus_layouts.folder(tmp_path)
    path = _config(tmp_path, [{"importer": "folder", "path": str(corpus)}])
    assert main(["Import", "--corpus", "folder-recordings", "--config", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    layout = Layout(load_config(path))
    assert f"would remove {layout.import_files('folder-recordings').root}  (Import_" in out
    for split in SPLITS:
        assert f"would remove {layout.features_cache(split)}" in out
    assert f"would remove {layout.train_run.root}" in out and f"would remove {layout.lm.root}" in out
    assert "converted" not in out  # the converted copies are shared by every import: kept


def test_data_text_moves_the_stages_that_normalise_text_even_without_corpora(tmp_path, write_config):
    """data.text normalises the manifests of data.*_files too (issue 23: one text path), so a config
    without corpora gets new Features and LanguageModel fingerprints when it changes; keys that change no
    text (data.corpora empty either way) leave them alone."""
    base = f"paths:\n  work_dir: {tmp_path}\ndata:\n  train_files: [{SAMPLE / 'train.csv'}]\n"
    plain = Layout(load_config(write_config(base, "a.yaml")))
    text = Layout(load_config(write_config(base + "  text:\n    case: keep\n", "b.yaml")))
    same = Layout(load_config(write_config(base + "  corpora: []\n", "c.yaml")))
    assert plain.features_fingerprint("train") != text.features_fingerprint("train")
    assert plain.lm_fingerprint != text.lm_fingerprint
    assert (plain.features_fingerprint("train"), plain.lm_fingerprint) == (
        same.features_fingerprint("train"),
        same.lm_fingerprint,
    )


def test_corpora_round_trip_through_the_saved_config(tmp_path):
    """Train saves the resolved config as YAML: data.corpora (with an importer option and named parts)
    and data.text come back the same."""
    from pipeline.config_loader import config_from_dict, config_to_dict

    corpus = corpus_layouts.librispeech(tmp_path / "corpus")
    folder = corpus_layouts.folder(tmp_path)
    path = _config(
        tmp_path,
        [
            {"importer": "librispeech", "path": str(corpus), "train": ["train-clean-100"], "dev": []},
            {
                "importer": "folder",
                "path": str(folder),
                "audio_suffixes": [".wav"],
                "salt": "x",
                "name": "mine",
            },
        ],
        data={"text": {"digits": "reject"}},
    )
    config = load_config(path)
    assert config.data.corpora[1].options == (("audio_suffixes", (".wav",)),)
    assert [c.key for c in config.data.corpora] == ["librispeech-corpus", "mine"]
    again = config_from_dict(yaml.safe_load(yaml.safe_dump(config_to_dict(config))), config.source)
    assert again == config


@pytest.mark.slow
def test_a_common_voice_corpus_without_a_features_section_trains(tmp_path):
    """Resampling by default (issue 37): a hand-written config adding a Common Voice corpus, with no
    ``features`` section, gets its 48 kHz MP3 clips resampled to 16 kHz (counted in the Features summary)
    instead of every clip rejected as wrong_sample_rate, and trains a tiny model to the end."""
    from pipeline.features.cache import cache_summary
    from tasks import Train

    counts = {"train": 8, "dev": 4, "test": 4}
    folder = corpus_layouts.common_voice_speech(tmp_path / "cv", counts, missing=0)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "paths": {"work_dir": str(tmp_path / "work"), "alphabet": str(ALPHABET)},
                "data": {"corpora": [{"importer": "common_voice", "path": str(folder)}]},
                "model": {"n_hidden": 16, "dropout_rate": 0.0},
                "training": {"epochs": 1, "batch_size": 4, "dev_batch_size": 4, "report_count": 0},
                "augment": {"speed_factors": []},
            }
        )
    )
    loaded = load_config(config)
    assert loaded.features.resample and loaded.features.downmix
    layout = Layout(loaded)
    assert luigi.build([Train(config=str(config))], local_scheduler=True)
    summary = features_stage(layout, "dev")  # the cache is there: its summary, from the cache
    assert (summary.kept, summary.rejected, summary.resampled, summary.downmixed) == (4, 0, 4, 0)
    summary = features_stage(layout, "test")  # Train did not need it: made now
    assert (summary.kept, summary.rejected, summary.resampled, summary.downmixed) == (4, 0, 4, 0)
    for split in ("train", "dev"):
        found = cache_summary(layout.features_cache(split))
        assert (found["samples"], found["resampled_files"]) == (counts[split], counts[split])
    assert json.loads(layout.train_run.report.read_text())


def test_an_import_made_by_older_importers_is_made_again(tmp_path, monkeypatch):
    """An import's fingerprint carries the importers' version (``IMPORT_VERSION``): an import made before
    a change to what importers produce from the same files (issue 37's de-duplication, say) is not
    trusted by newer code, and only Import and what follows it move."""
    import pipeline.data.importing as importing

    corpus = corpus_layouts.librispeech(tmp_path / "corpus")
    path = _config(tmp_path, [{"importer": "librispeech", "path": str(corpus)}])
    before = Layout(load_config(path))
    now = before.import_files("librispeech-corpus").root, before.fingerprint("features", split="train")
    monkeypatch.setattr(importing, "IMPORT_VERSION", importing.IMPORT_VERSION - 1)
    forget_corpus_listings()
    older = Layout(load_config(path))
    assert older.import_files("librispeech-corpus").root != now[0]
    assert older.fingerprint("features", split="train") != now[1]
    assert older.fingerprint("lm") != before.fingerprint("lm")  # the LM reads the imported text too


def test_tuning_without_a_dev_split_stops_before_anything_runs(tmp_path):
    """decoder.tune searches on the dev split: a config that gives none stops in one line naming the key
    (it used to import and extract features first and fail at the dev split's FeaturesSplit)."""
    config_path = tmp_path / "tune.yaml"
    config_path.write_text(
        f"extends: {ROOT / 'configs' / 'sample.yaml'}\npaths: {{work_dir: {tmp_path / 'work'}}}\n"
        "data: {dev_files: []}\ndecoder: {tune: true}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "Export", "--config", str(config_path), "--local-scheduler"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "decoder.tune: TuneDecoder searches on the dev split and this config gives none" in lines[0]
    assert not (tmp_path / "work").exists()


def test_an_importer_of_ones_own_imports_through_the_dag_and_its_features_follow(tmp_path):
    """``data.corpora[].importer`` names a module of one's own (tests/plugins/tsv_pairs_importer.py): the
    Import task lists, reads and splits its layout (its drops counted as every importer's are), and the
    Features stage reads the import as it reads a built-in one's."""
    import shutil

    root = tmp_path / "pairs"
    (root / "clips").mkdir(parents=True)
    for split, count in (("train", 6), ("dev", 2), ("test", 2)):
        lines = []
        for index, (audio, text) in enumerate(corpus_layouts._sample_rows(split, count)):
            shutil.copy(audio, root / "clips" / f"{split}-{audio.name}")
            lines.append(f"{split}-{audio.name}\t{split}{index // 2}\t{text}")
        if split == "train":
            lines.append("no-tabs-here")
        (root / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpora = [{"importer": "tests.plugins.tsv_pairs_importer", "path": str(root)}]
    path = _config(tmp_path, corpora, data={"max_reject_fraction": 0.5})
    assert luigi.build([FeaturesSplit(config=str(path), split="train")], local_scheduler=True)
    layout = Layout(load_config(path))
    files = layout.import_files("tsv_pairs_importer-pairs")
    report = json.loads(files.report.read_text())
    assert (report["rows"], report["kept"], report["dropped_by_reason"]) == (11, 10, {"malformed_row": 1})
    assert {split: len(_rows(files.manifest(split))) for split in SPLITS} == {"train": 6, "dev": 2, "test": 2}
    assert {r["speaker"] for r in _rows(files.manifest("train"))} == {"train0", "train1", "train2"}
    assert layout.features_cache("train").exists()
