"""Issue 48, the Align stage: long recordings with their whole text cut into utterances.

The fast tests check the text cutting, the joining of aligned neighbours, the config and the DAG's wiring
(an Align instead of an Import for a ``recordings`` corpus, its manifests feeding Features, its
fingerprint following the aligner model). The long ones (``make test-long``) train the sample config's
aligner through the DAG, then align recordings espeak-ng speaks sentence by sentence with pauses of random
length between them (``recordings_factory``: every boundary known), with an unread paragraph and hostile
recordings beside them, through the real Luigi Align task.
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
from pathlib import Path

import luigi
import numpy as np
import pytest
from recordings_factory import SENTENCES, make_recording

from pipeline.config import ConfigError
from pipeline.config_loader import load_config
from pipeline.dag import pipeline_instances, upstream
from pipeline.data.align import Aligned, Unit, merge_units, split_text
from pipeline.layout import Layout

ROOT = Path(__file__).resolve().parents[1]


def test_the_text_is_cut_at_sentence_ends_and_line_breaks_and_long_sentences_at_clauses():
    text = "Chapter One.\nIt was late. Was it? Yes!\n\n" + "word, " * 30 + "end\n"
    units = split_text(text, max_chars=60)
    assert [u.text for u in units[:5]] == ["Chapter One.", "It was late.", "Was it?", "Yes!", units[4].text]
    assert [u.line for u in units[:4]] == [1, 2, 2, 2]
    long = [u for u in units if u.line == 4]
    assert len(long) > 2 and all(len(u.text) <= 60 for u in long)
    assert " ".join(u.text for u in long) == ("word, " * 30 + "end").strip()
    assert split_text("   \n\n", 60) == []


def test_aligned_neighbours_of_one_line_are_joined_up_to_max_seconds():
    units = [Unit("a", 1), Unit("b", 1), Unit("c", 1), Unit("d", 2), Unit("e", 2), Unit("f", 2)]
    found = [
        Aligned(0, 4, -1),
        Aligned(4.5, 8, -2),
        Aligned(8.5, 14, -1),
        Aligned(15, 16, -1),
        None,
        Aligned(20, 21, -1),
    ]
    merged = merge_units(units, found, max_seconds=10)
    assert [indices for indices, _ in merged] == [[0, 1], [2], [3], [5]]
    assert merged[0][1] == Aligned(0, 8, -2)  # the lowest score of the two


def _recordings_config(tmp_path: Path, corpus: Path, model: Path, extra: str = "") -> Path:
    config = tmp_path / "recordings.yaml"
    config.write_text(
        f"paths:\n  work_dir: {tmp_path / 'work'}\n  alphabet: {ROOT / 'data/alphabet.txt'}\n"
        f"data:\n  corpora:\n    - importer: recordings\n      path: {corpus}\n"
        f"      align:\n        model: {model}\n        max_seconds: 12\n{extra}",
        encoding="utf-8",
    )
    return config


def test_a_recordings_corpus_is_aligned_not_imported_and_its_manifests_feed_features(tmp_path):
    corpus = tmp_path / "chapters"
    corpus.mkdir()
    (corpus / "one.flac").write_bytes(b"")
    (corpus / "one.txt").write_text("Some text.\n", encoding="utf-8")
    model = tmp_path / "aligner.tflite"
    model.write_bytes(b"weights, version 1")
    config = load_config(_recordings_config(tmp_path, corpus, model))
    assert ("align", {"corpus": "recordings-chapters"}) in upstream(config, "features", {"split": "train"})
    by_corpus = [n for n in pipeline_instances(config, {"corpus": "recordings-chapters"}) if n[1]]
    assert by_corpus == [("align", {"corpus": "recordings-chapters"})]  # no Import of it
    layout = Layout(config)
    assert layout.split_manifests("train") == (
        str(layout.align_files("recordings-chapters").manifest("train")),
    )
    assert layout.align_files("recordings-chapters").root.parent == tmp_path / "work/align"
    before = layout.fingerprint("align", corpus="recordings-chapters")
    features = layout.fingerprint("features", split="train")
    model.write_bytes(b"weights, version 2")
    after = Layout(load_config(_recordings_config(tmp_path, corpus, model)))
    assert after.fingerprint("align", corpus="recordings-chapters") != before
    assert after.fingerprint("features", split="train") != features


@pytest.mark.parametrize(
    ("align", "message"),
    [
        ("{max_seconds: 12}", "align.model: name the model"),
        ("{model: m, max_second: 3}", "unknown key 'max_second'"),
        ("{model: m, min_score: high}", "align.min_score: expected float"),
    ],
)
def test_a_wrong_align_setting_is_one_line_naming_it(tmp_path, align, message):
    corpus = tmp_path / "chapters"
    corpus.mkdir()
    config = tmp_path / "bad.yaml"
    config.write_text(
        f"paths:\n  work_dir: {tmp_path / 'work'}\ndata:\n  corpora:\n    - importer: recordings\n"
        f"      path: {corpus}\n      align: {align}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as error:
        layout = Layout(load_config(config))
        layout.fingerprint("align", corpus="recordings-chapters")
    assert message in str(error.value) and "\n" not in str(error.value)


# -- with a trained aligner -------------------------------------------------------------------------------


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _cut_errors(
    cuts: list[tuple[float, float, str]], order: list[str], spans: list
) -> tuple[int, list[float]]:
    """(sentences found, boundary errors) of utterances ``cuts`` (start, end, transcript) of a recording whose
    sentences ``order`` are spoken at ``spans``. A cut is right anywhere in the silence between two
    sentences (the audio's neighbours, said in the text or not): its error is how far it is from it."""
    found, errors = 0, []
    for start, end, text in cuts:
        first = next(i for i, s in enumerate(order) if text.startswith(s))
        last = next(i for i in range(len(order) - 1, -1, -1) if text.endswith(order[i]))
        before = spans[first - 1][1] if first else 0.0
        after = spans[last + 1][0] if last + 1 < len(order) else end + 1
        errors += [
            max(0.0, start - spans[first][0], before - start),
            max(0.0, spans[last][1] - end, end - after),
        ]
        found += last - first + 1
    return found, errors


@pytest.mark.long
def test_long_recordings_are_cut_at_their_sentences_and_hostile_ones_named(
    tmp_path, sample_aligner, tasks_in_process
):
    from pipeline.data.align import align_units
    from pipeline.data.aligner import Aligner
    from tasks import Alignments

    corpus = tmp_path / "chapters"
    corpus.mkdir()
    truth, sentences = {}, list(SENTENCES)
    for seed in range(3):
        name = f"chapter{seed}"
        order = sentences[seed:] + sentences[:seed]
        truth[name] = (order, make_recording(corpus / f"{name}.flac", order, seed))
    written = {name: [s.capitalize() + "." for s in order] for name, (order, _) in truth.items()}
    # text the reader never read: a preface and a paragraph in the middle; a paragraph at the end
    unread = (
        "This edition was prepared by the editors and is not read aloud. It has notes on the translation."
    )
    written["chapter0"] = [unread, *written["chapter0"][:10], unread, *written["chapter0"][10:]]
    written["chapter1"] = [*written["chapter1"], unread]
    # speech the text does not hold: five sentences of chapter2 are left out of its text
    said = list(range(5)) + list(range(10, len(sentences)))
    written["chapter2"] = [written["chapter2"][i] for i in said]
    for name, lines in written.items():
        (corpus / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # hostile recordings: each refused in one line naming its file, the rest going on
    shutil.copy(corpus / "chapter1.flac", corpus / "nowords.flac")
    (corpus / "nowords.txt").write_text("... --- !!!\n", encoding="utf-8")
    make_recording(corpus / "short.flac", sentences[:1], 7)
    (corpus / "short.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    shutil.copy(corpus / "chapter1.flac", corpus / "armenian.flac")
    (corpus / "armenian.txt").write_text("ես ապրում եմ երևանում\nայսօր եղանակը շատ լավ է\n", encoding="utf-8")
    shutil.copy(corpus / "chapter1.flac", corpus / "latin1.flac")
    (corpus / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))

    config = _recordings_config(tmp_path, corpus, sample_aligner, "      split_fractions: {train: 1.0}\n")
    assert luigi.build([Alignments(config=str(config))], local_scheduler=True)
    folder = Layout(load_config(config)).align_files("recordings-chapters")
    report = json.loads(folder.report.read_text(encoding="utf-8"))
    rows = _rows(folder.manifest("train"))
    rejects = _rows(folder.rejects)
    refused = {Path(r["audio"]).stem: r for r in rejects if r["reason"] != "misaligned"}
    assert (
        refused["nowords"]["reason"] == "empty_transcript" and "nowords.txt" in refused["nowords"]["detail"]
    )
    assert (
        refused["short"]["reason"] == "text_longer_than_audio" and "short.txt" in refused["short"]["detail"]
    )
    assert refused["armenian"]["reason"] == "alphabet_mismatch"
    assert refused["latin1"]["reason"] == "bad_encoding" and "latin1.txt" in refused["latin1"]["detail"]
    assert all("\n" not in r["detail"] for r in rejects)
    # the unread paragraphs are rejected, never smeared over their neighbours
    misaligned = {r["source"].rsplit("/", 1)[1] for r in rejects if r["reason"] == "misaligned"}
    assert misaligned == {"chapter0.txt:1", "chapter0.txt:12", "chapter1.txt:21"}
    assert report["dropped_by_reason"]["misaligned"] == 6  # each unread paragraph is two sentences long

    found, errors = 0, []
    for name, (order, spans) in truth.items():
        cuts = [
            (float(r["offset"]), float(r["offset"]) + float(r["duration"]), r["transcript"])
            for r in rows
            if Path(r["wav_filename"]).stem == name
        ]
        counted, more = _cut_errors(cuts, order, spans)
        found, errors = found + counted, errors + more
    total = sum(len(order) for order, _ in truth.values()) - 5  # the five sentences chapter2's text lacks
    assert found >= 0.95 * total, (found, total)
    assert statistics.median(errors) < 0.06, sorted(errors)[-5:]
    assert float(np.percentile(errors, 90)) < 0.2, sorted(errors)[-5:]
    assert not list(folder.root.parent.glob(".*.aligned"))

    # the same in windows of 20 s (a long recording's 4 minutes): unread text and speech the text lacks,
    # and sentences crossing a window's end
    aligner = Aligner(sample_aligner)
    found, errors, total = 0, [], 0
    for name in ("chapter0", "chapter2"):
        order, spans = truth[name]
        posteriors = aligner.posteriors(corpus / f"{name}.flac", tmp_path / f"{name}.posteriors")
        lines = [line.rstrip(".").lower() for line in written[name]]
        placed = align_units(
            posteriors,
            [aligner.labels(line)[0] for line in lines],
            aligner.blank,
            aligner.seconds_per_frame,
            -3.0,
            aligner.alphabet.space_index,
            window_s=20.0,
        )
        assert [p is None for p, line in zip(placed, lines, strict=True) if line not in order] == [True] * (
            len(lines) - sum(line in order for line in lines)
        )
        cuts = [(p.start, p.end, line) for p, line in zip(placed, lines, strict=True) if p is not None]
        counted, more = _cut_errors(cuts, order, spans)
        found, errors, total = found + counted, errors + more, total + sum(line in order for line in lines)
    assert found >= 0.95 * total, (found, total)
    assert statistics.median(errors) < 0.06, sorted(errors)[-5:]


@pytest.mark.long
def test_an_interrupted_alignment_resumes_at_the_recording_it_stopped_at(
    tmp_path, sample_aligner, monkeypatch
):
    import pipeline.stages.align as align_module

    corpus = tmp_path / "chapters"
    corpus.mkdir()
    for seed in range(3):
        make_recording(corpus / f"c{seed}.flac", list(SENTENCES[:4]), seed)
        (corpus / f"c{seed}.txt").write_text("\n".join(SENTENCES[:4]) + "\n", encoding="utf-8")
    layout = Layout(load_config(_recordings_config(tmp_path, corpus, sample_aligner)))
    aligned = []
    real = align_module.align_recording

    def counting(row, *args):
        aligned.append(Path(row.audio).name)
        return real(row, *args)

    monkeypatch.setattr(align_module, "align_recording", counting)

    def stop_after_two(done, total, hours):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        align_module.align_stage(layout, "recordings-chapters", stop_after_two)
    assert not layout.align_files("recordings-chapters").report.exists()
    first = list(aligned)
    report = align_module.align_stage(layout, "recordings-chapters")
    assert len(first) == 2 and aligned[2:] == ["c2.flac"]
    assert report["recordings"] == 3 and report["kept"] >= 10
