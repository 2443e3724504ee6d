"""Issue 34's "done when", through the DAG with real Luigi: a two-language model (English and French corpora
spoken by espeak-ng) trains with one head per language; each language's export (the shared encoder and its
head, its alphabet, ``"task"`` in its metadata) transcribes its own language through the client; a changed
French manifest re-runs what the fingerprints say and nothing else; ``shared`` and ``separate`` train to
Evaluate.

Needs espeak-ng (as tests/test_languages.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import luigi
import numpy as np
import pytest
import tensorflow as tf

from native_client import Model
from native_client.alphabet import load_alphabet
from native_client.audio import load_for_model
from native_client.metadata import load_metadata
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.model.checkpoints import resolve_checkpoint
from pipeline.model.heads import MultiTaskModel
from pipeline.reports import EvaluationReport, TrainReport, TuneReport, read_report
from pipeline.stages.train import task_data
from tasks import Evaluate, Export, Transcribe
from tasks.base import ConfigTask
from tests.conftest import ROOT
from tests.test_languages import LANGUAGES, Language, espeak_corpus

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tasks_in_process")]

ENGLISH = Language(
    "english",
    "en-us",
    (
        "the cat sat on the mat",
        "open the door please",
        "good morning to you",
        "the sun is bright",
        "we drink tea",
    ),
)


def two_languages(tmp_path: Path, sharing: str) -> Path:
    """A tiny config of two tasks, en and fr, each with its own espeak-ng corpus and built alphabet."""
    en = espeak_corpus(tmp_path / "en", ENGLISH)
    fr = espeak_corpus(tmp_path / "fr", LANGUAGES["french"])
    path = tmp_path / f"{sharing}.yaml"
    path.write_text(
        textwrap.dedent(f"""
        paths: {{work_dir: {tmp_path / "work"}, export_dir: {tmp_path / "export"}}}
        features: {{resample: true, workers: 1, numcep: 13, nfilt: 20}}
        model: {{n_hidden: 16, n_context: 2, dropout_rate: 0.0}}
        training: {{epochs: 1, batch_size: 5, dev_batch_size: 5, report_count: 1}}
        early_stop: {{rule: "off"}}
        export: {{n_steps: 4}}
        decoder: {{type: greedy, lm_builder: python}}
        multitask:
          sharing: {sharing}
          tasks:
            - name: en
              data: {{train_files: [{en["train"]}], test_files: [{en["test"]}]}}
              paths: {{alphabet: auto}}
            - name: fr
              data: {{train_files: [{fr["train"]}], test_files: [{fr["test"]}], text: {{language: fr}}}}
              paths: {{alphabet: auto}}
        """)
    )
    return path


class _Ran:
    """The config tasks Luigi runs while it is open, as ``Task(parameters)``."""

    def __enter__(self):
        self.names: list[str] = []

        def started(task):
            values = [str(getattr(task, p)) for p in ("corpus", "split", "task") if getattr(task, p, "")]
            self.names.append(type(task).__name__ + (f"({', '.join(values)})" if values else ""))

        self._handler = ConfigTask.event_handler(luigi.Event.START)(started)
        return self

    def __exit__(self, *exc):
        ConfigTask.remove_event_handler(luigi.Event.START, self._handler)


def _trained_heads(layout: Layout) -> MultiTaskModel:
    """The multi-task model of ``layout``'s Train run, its best checkpoint loaded."""
    tasks = task_data(layout)
    model = MultiTaskModel(
        layout.config.model,
        layout.config.multitask.sharing,
        tuple(task.name for task in tasks),
        tasks[0].train.n_input,
        tuple(task.alphabet.n_classes for task in tasks),
    )
    tf.train.Checkpoint(weights=model.named_weights()).read(
        resolve_checkpoint(layout.train_run.best)
    ).expect_partial()
    return model


def _client(export: Path, audio: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(export), "--audio", str(audio)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_two_languages_train_with_a_head_each_and_each_export_speaks_its_own(tmp_path, capsys):
    path = two_languages(tmp_path, "heads")
    config, clips = str(path), {"en": tmp_path / "en" / "04.wav", "fr": tmp_path / "fr" / "04.wav"}

    def roots():
        # new task objects (Luigi keeps one per parameters in a process): each reads the config anew
        luigi.task_register.Register.clear_instance_cache()
        transcribe = [Transcribe(config=config, task=task, audio=str(clip)) for task, clip in clips.items()]
        return transcribe + [Evaluate(config=config, task=task) for task in clips]

    with _Ran() as first:
        assert luigi.build(roots(), local_scheduler=True)
    printed = capsys.readouterr().out
    for task, clip in clips.items():  # each transcript says whose export made it
        assert f"task:       {task}\naudio:      {clip}\n" in printed, printed
    assert sorted(first.names) == sorted(
        [
            *(
                f"{stage}({task})"
                for task in ("en", "fr")
                for stage in ("Alphabet", "LanguageModel", "Evaluate")
            ),
            *(f"{stage}({task})" for task in ("en", "fr") for stage in ("Export", "Transcribe")),
            *(f"FeaturesSplit({split}, {task})" for task in ("en", "fr") for split in ("train", "test")),
            "Train",
        ]
    )
    layout = Layout(load_config(path))
    report = read_report(layout.train_run.report, TrainReport)
    assert [task["name"] for task in report.tasks] == ["en", "fr"]
    trained = _trained_heads(layout)
    for index, task in enumerate(("en", "fr")):
        export = tmp_path / "export" / task
        metadata = load_metadata(export)
        assert metadata.raw["task"] == task
        alphabet = load_alphabet(layout.for_task(task).alphabet)
        assert metadata.alphabet.labels == alphabet.labels
        # the export is the shared encoder and this task's head: the client's logits are the head's
        client = Model(export)
        samples = load_for_model(clips[task], 16000, convert_rate=True)
        frames = client.metadata.features.frames(samples)[None]
        head, _ = trained.forward(index, tf.constant(frames), tf.constant([frames.shape[1]]), training=False)
        np.testing.assert_allclose(client.logits(samples), head.numpy()[0], atol=1e-4)
        evaluation = read_report(
            layout.evaluation_report(layout.for_task(task).evaluate_dir), EvaluationReport
        )
        assert evaluation.samples_count == 2
        # the client runs each export as it runs any: its transcript is in its own language's letters
        text = _client(export, clips[task])
        assert set(text) <= set(alphabet.labels), (task, text)
        record = json.loads(next((export / "transcripts").glob("*.json")).read_text(encoding="utf-8"))
        assert record["text"] == text
    assert "é" in load_metadata(tmp_path / "export" / "fr").alphabet.labels
    assert "é" not in load_metadata(tmp_path / "export" / "en").alphabet.labels

    # A changed French manifest (its first row dropped): French's alphabet, features and LM, the shared
    # Train and what follows run again; nothing of English's before Train does.
    manifest = tmp_path / "fr" / "train.csv"
    header, _, *rows = manifest.read_text(encoding="utf-8").splitlines(keepends=True)
    manifest.write_text(header + "".join(rows), encoding="utf-8")
    with _Ran() as second:
        assert luigi.build(roots(), local_scheduler=True)
    assert sorted(second.names) == sorted(
        [
            "Alphabet(fr)",
            "FeaturesSplit(train, fr)",
            "FeaturesSplit(test, fr)",  # its labels come from fr's alphabet
            "LanguageModel(fr)",  # it reads the training transcripts
            "Train",
            *(f"{stage}({task})" for task in ("en", "fr") for stage in ("Evaluate", "Export", "Transcribe")),
        ]
    )
    assert read_report(layout.train_run.report, TrainReport).train_samples == 10  # still the old run's
    assert read_report(Layout(load_config(path)).train_run.report, TrainReport).train_samples == 9


@pytest.mark.parametrize("sharing", ["shared", "separate"])
def test_shared_and_separate_train_two_tasks_to_evaluate(tmp_path, sharing):
    path = two_languages(tmp_path, sharing)
    config = str(path)
    with _Ran() as ran:
        assert luigi.build(
            [Evaluate(config=config, task=task) for task in ("en", "fr")], local_scheduler=True
        )
    layout = Layout(load_config(path))
    alphabets = [name for name in ran.names if name.startswith("Alphabet")]
    # shared: one output layer over one alphabet, built from both languages' transcripts
    assert alphabets == (["Alphabet"] if sharing == "shared" else ["Alphabet(en)", "Alphabet(fr)"])
    labels = [load_alphabet(layout.for_task(task).alphabet).labels for task in ("en", "fr")]
    assert (labels[0] == labels[1]) == (sharing == "shared")
    for task in ("en", "fr"):
        evaluation = read_report(
            layout.evaluation_report(layout.for_task(task).evaluate_dir), EvaluationReport
        )
        assert evaluation.samples_count == 2 and evaluation.loss > 0
    stored = read_report(layout.train_run.report, TrainReport)
    assert stored.global_step == 2  # proportional: one batch of each task


def test_a_phoneme_head_trains_beside_the_characters_and_is_not_exported(tmp_path):
    """An auxiliary task: the English transcripts as IPA (espeak-ng) on the same audio, a head of its own;
    trained and evaluated, never exported."""
    from tasks.rerun import dag_roots

    en = espeak_corpus(tmp_path / "en", ENGLISH)
    path = tmp_path / "phones.yaml"
    path.write_text(
        textwrap.dedent(f"""
        paths: {{work_dir: {tmp_path / "work"}, export_dir: {tmp_path / "export"}, alphabet: auto}}
        features: {{resample: true, workers: 1, numcep: 13, nfilt: 20}}
        model: {{n_hidden: 16, n_context: 2, dropout_rate: 0.0}}
        training: {{epochs: 1, batch_size: 5, dev_batch_size: 5, report_count: 1}}
        early_stop: {{rule: "off"}}
        export: {{n_steps: 4}}
        decoder: {{type: greedy, lm_builder: python}}
        multitask:
          sharing: heads
          tasks:
            - name: en
              data: {{train_files: [{en["train"]}], test_files: [{en["test"]}], text: {{language: en-US}}}}
            - name: en_phones
              weight: 0.3
              targets: phonemes
              of: en
              export: false
        """)
    )
    roots = dag_roots(str(path), {"audio": None})
    assert sorted((type(t).__name__, t.task) for t in roots) == [
        ("Evaluate", "en"),
        ("Evaluate", "en_phones"),
        ("Export", "en"),
    ]
    with _Ran() as ran:
        assert luigi.build(roots, local_scheduler=True)
    assert {"Phonemes(en_phones)", "Alphabet(en_phones)", "FeaturesSplit(train, en_phones)"} <= set(ran.names)
    layout = Layout(load_config(path))
    phones = layout.for_task("en_phones")
    rows = (phones.phonemes_files.manifest("train")).read_text(encoding="utf-8").splitlines()
    assert rows[0] == "wav_filename,wav_filesize,transcript,offset,duration" and len(rows) == 6
    first = rows[1].split(",")
    assert first[0] == str(tmp_path / "en" / "00.wav")
    assert first[2] == "ðə kæt sæt ɔnðə mæt"  # espeak-ng's IPA of "the cat sat on the mat", stress marks out
    labels = load_alphabet(phones.alphabet).labels
    assert {"ð", "ə", "æ"} <= set(labels) and "ˈ" not in labels and "c" not in labels
    report = read_report(layout.train_run.report, TrainReport)
    assert [(t["name"], t["weight"]) for t in report.tasks] == [("en", 1.0), ("en_phones", 0.3)]
    assert all(t["batches_drawn"] == 1 for t in report.tasks)
    evaluation = read_report(layout.evaluation_report(phones.evaluate_dir), EvaluationReport)
    assert evaluation.samples_count == 2
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["en"]
    assert load_metadata(tmp_path / "export" / "en").raw["task"] == "en"


@pytest.mark.long
@pytest.mark.slow
def test_a_conformer_with_heads_tunes_each_task_s_decoder_and_exports_it(tmp_path):
    """The Conformer family through the multi-task DAG with one head per language, ``decoder.tune`` on: each
    task's TuneDecoder searches its own dev split with its own LM and settings (fr overrides the beam, the
    trials and the LM text), each export carries its own tuned pair, and the client's logits are the
    task's head's."""
    path = two_languages(tmp_path, "heads")
    (tmp_path / "fr-text.txt").write_text("le bon vin\nun bon pain\n", encoding="utf-8")
    text = path.read_text()
    for task in ("en", "fr"):  # a dev split (the test rows) for each task's TuneDecoder
        test = tmp_path / task / "test.csv"
        (tmp_path / task / "dev.csv").write_text(test.read_text(encoding="utf-8"), encoding="utf-8")
        text = text.replace(
            f"test_files: [{test}]", f"test_files: [{test}], dev_files: [{test.parent / 'dev.csv'}]"
        )
    text = text.replace(
        "model: {n_hidden: 16, n_context: 2, dropout_rate: 0.0}",
        "model: {architecture: conformer, conformer: {d_model: 16, heads: 2, layers: 1, conv_kernel: 3, "
        "subsampling: 2, subsampling_channels: 4, ff_mult: 2, dropout: 0.0, attention_dropout: 0.0}}",
    )
    text = text.replace(
        "decoder: {type: greedy, lm_builder: python}",
        "decoder: {lm_builder: python, tune: true, tune_trials: 3, beam_width: 4}",
    )
    fr_paths = "      paths: {alphabet: auto}\n"
    assert text.endswith(fr_paths)
    text += (
        f"      decoder: {{lm_corpus_files: [{tmp_path / 'fr-text.txt'}], beam_width: 8, tune_trials: 2}}\n"
    )
    path.write_text(text)
    config = str(path)
    with _Ran() as ran:
        assert luigi.build([Export(config=config, task=task) for task in ("en", "fr")], local_scheduler=True)
    assert {"TuneDecoder(en)", "TuneDecoder(fr)", "Train"} <= set(ran.names)
    layout = Layout(load_config(path))
    assert layout.config.model.architecture == "conformer"
    trained = _trained_heads(layout)
    for index, (task, beam, trials) in enumerate((("en", 4, 3), ("fr", 8, 2))):
        child = layout.for_task(task)
        tuned = read_report(child.tune_report, TuneReport)
        assert (tuned.search["beam_width"], len(tuned.trials), tuned.search["dev_samples"]) == (
            beam,
            trials,
            2,
        )
        export = tmp_path / "export" / task
        metadata = load_metadata(export)
        decoder = metadata.raw["decoder"]
        assert decoder["tuned"] and decoder["beam_width"] == beam
        assert (decoder["lm_alpha"], decoder["lm_beta"]) == (tuned.best.lm_alpha, tuned.best.lm_beta)
        assert metadata.raw["architecture"] == "conformer" and metadata.raw["task"] == task
        client = Model(export)
        samples = load_for_model(tmp_path / task / "04.wav", 16000, convert_rate=True)
        frames = client.metadata.features.frames(samples)[None]
        head, _ = trained.forward(index, tf.constant(frames), tf.constant([frames.shape[1]]), training=False)
        np.testing.assert_allclose(client.logits(samples), head.numpy()[0], atol=1e-4)
    vocabulary = {
        t: (tmp_path / "export" / t / "vocab.txt").read_text(encoding="utf-8").split() for t in ("en", "fr")
    }
    assert "vin" in vocabulary["fr"] and "vin" not in vocabulary["en"]  # fr's LM text, fr's only
    assert load_metadata(tmp_path / "export" / "en").raw["decoder"]["lm_alpha"] != decoder["lm_alpha"]
