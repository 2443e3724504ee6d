"""Issue 48, the Clean stage: every transcript scored against a model, the suspect ones left out.

The fast tests check the wiring: with ``data.clean.model`` the stages that read a cleaned split's manifests
read Clean's (and follow its fingerprint), the other splits and a config without it are as before. The
long ones score the sample's dev and test clips, one transcript in ten swapped with another's, with the
sample config's model trained through the DAG (``conftest.sample_aligner``), through the real Luigi task,
and interrupt and resume it.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import luigi
import pytest

from pipeline.config import ConfigError
from pipeline.config_loader import load_config
from pipeline.dag import upstream
from pipeline.layout import Layout

ROOT = Path(__file__).resolve().parents[1]


def _config(
    tmp_path: Path, clean: str, train: Path | None = None, dev: Path | None = None, alphabet: str = "auto"
) -> Path:
    path = tmp_path / "clean.yaml"
    path.write_text(
        f"paths:\n  work_dir: {tmp_path / 'work'}\n  alphabet: {alphabet}\n"
        f"data:\n  train_files: [{train or ROOT / 'data/sample/train.csv'}]\n"
        f"  dev_files: [{dev or ROOT / 'data/sample/dev.csv'}]\n"
        f"  test_files: [{ROOT / 'data/sample/test.csv'}]\n"
        f"{clean}",
        encoding="utf-8",
    )
    return path


def test_the_stages_read_the_cleaned_splits_from_clean_and_the_others_as_before(tmp_path):
    model = tmp_path / "model.tflite"
    model.write_bytes(b"one")
    plain = load_config(_config(tmp_path, ""))
    config = load_config(_config(tmp_path, f"  clean:\n    model: {model}\n"))
    assert upstream(config, "features", {"split": "train"}) == [("clean", {}), ("alphabet", {})]
    assert upstream(config, "features", {"split": "dev"}) == [("clean", {}), ("alphabet", {})]
    assert upstream(config, "features", {"split": "test"}) == [("alphabet", {})]
    assert upstream(config, "alphabet", {}) == [("clean", {})]
    assert ("clean", {}) in upstream(config, "lm", {})
    assert upstream(plain, "features", {"split": "train"}) == [("alphabet", {})]
    layout, before = Layout(config), Layout(plain)
    assert layout.split_manifests("train") == (str(layout.clean_files.manifest("train")),)
    assert layout.split_manifests("test") == before.split_manifests("test")
    # with an alphabet file (auto builds it from the cleaned train split) the test split keeps its
    # fingerprint, and a cleaned one follows the model
    alphabet = str(ROOT / "data/alphabet.txt")
    plain = Layout(load_config(_config(tmp_path, "", alphabet=alphabet)))
    layout = Layout(load_config(_config(tmp_path, f"  clean:\n    model: {model}\n", alphabet=alphabet)))
    assert layout.fingerprint("features", split="test") == plain.fingerprint("features", split="test")
    assert layout.fingerprint("features", split="train") != plain.fingerprint("features", split="train")
    train = layout.fingerprint("features", split="train")
    model.write_bytes(b"two")
    moved = Layout(load_config(_config(tmp_path, f"  clean:\n    model: {model}\n", alphabet=alphabet)))
    assert moved.fingerprint("features", split="train") != train


def test_an_unknown_split_to_clean_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.clean\.splits: unknown split\(s\) tset"):
        load_config(_config(tmp_path, "  clean:\n    model: x\n    splits: [train, tset]\n"))


# -- with a trained model ---------------------------------------------------------------------------------


def _swapped(tmp_path: Path) -> tuple[Path, set[str]]:
    """The sample's dev and test clips in one manifest, one transcript in ten swapped with another's."""
    rows = []
    for name in ("dev", "test"):
        with open(ROOT / f"data/sample/{name}.csv", newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                rows.append({**row, "wav_filename": str(ROOT / "data/sample" / row["wav_filename"])})
    rng = random.Random(48)
    chosen = sorted(rng.sample(range(len(rows)), len(rows) // 10))
    texts = [rows[i]["transcript"] for i in chosen]
    for k, i in enumerate(chosen):
        rows[i]["transcript"] = texts[(k + 1) % len(texts)]
    path = tmp_path / "swapped.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["wav_filename", "wav_filesize", "transcript"])
        writer.writeheader()
        writer.writerows(rows)
    return path, {rows[i]["wav_filename"] for i in chosen}


@pytest.mark.long
def test_clean_flags_swapped_transcripts_and_keeps_the_rest(tmp_path, sample_aligner, tasks_in_process):
    from tasks import Clean, FeaturesSplit

    manifest, swapped = _swapped(tmp_path)
    config = _config(
        tmp_path, f"  clean:\n    model: {sample_aligner}\n    splits: [train]\n", train=manifest
    )
    assert luigi.build([Clean(config=str(config))], local_scheduler=True)
    files = Layout(load_config(config)).clean_files
    with open(files.rejects, newline="", encoding="utf-8") as handle:
        rejects = list(csv.DictReader(handle))
    flagged = {row["wav_filename"] for row in rejects}
    assert len(flagged & swapped) >= 0.9 * len(swapped), (len(flagged & swapped), len(swapped))
    assert len(flagged - swapped) <= (123 - len(swapped)) / 20, flagged - swapped
    assert {row["reason"] for row in rejects} == {"suspect_transcript"}
    with open(files.scores, newline="", encoding="utf-8") as handle:
        scores = list(csv.DictReader(handle))
    assert len(scores) == 123 and scores[0]["verdict"] == "suspect_transcript"
    kept = [float(row["cer"]) for row in scores if row["verdict"] == "keep"]
    assert kept == sorted(kept, reverse=True)  # worst first
    report = json.loads(files.report.read_text(encoding="utf-8"))
    assert report["splits"]["train"]["rejected"] == len(rejects)
    assert set(report["splits"]) == {"train"}  # dev and test not cleaned
    # the later stages read the cleaned manifest
    assert luigi.build([FeaturesSplit(config=str(config), split="train")], local_scheduler=True)
    with open(files.manifest("train"), newline="", encoding="utf-8") as handle:
        assert sum(1 for _ in csv.DictReader(handle)) == 123 - len(rejects)


@pytest.mark.long
def test_an_interrupted_clean_resumes_at_the_row_it_stopped_at(tmp_path, sample_aligner, monkeypatch):
    import pipeline.stages.clean as clean_module

    config = _config(tmp_path, f"  clean:\n    model: {sample_aligner}\n    splits: [dev]\n")
    layout = Layout(load_config(config))
    scored = []
    real = clean_module.score_row

    def counting(split, source, *args):
        scored.append(source)
        return real(split, source, *args)

    monkeypatch.setattr(clean_module, "score_row", counting)

    def stop(done, total):
        if done >= 50:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        clean_module.clean_stage(layout, stop)
    assert not layout.clean_files.report.exists() and layout.clean_files.journal.exists()
    assert layout.clean_files.journal.parent == layout.clean_files.root.parent
    with open(layout.clean_files.journal, "a", encoding="utf-8") as journal:
        journal.write("dev,/data/sample/dev.csv:52,/torn/by/a/kill")  # a line cut short, no line end
    first = len(scored)
    report = clean_module.clean_stage(layout)
    assert first == 50 and len(scored) == 59  # the other 9 only
    assert report["splits"]["dev"]["rows"] == 59
    # another threshold judges the same scores again: another folder, nothing scored again
    stricter = Layout(
        load_config(
            _config(tmp_path, f"  clean:\n    model: {sample_aligner}\n    splits: [dev]\n    max_cer: 0.3\n")
        )
    )
    assert stricter.clean_files.root != layout.clean_files.root
    assert stricter.clean_files.journal == layout.clean_files.journal
    again = clean_module.clean_stage(stricter)
    assert len(scored) == 59 and again["splits"]["dev"]["rejected"] >= report["splits"]["dev"]["rejected"]
