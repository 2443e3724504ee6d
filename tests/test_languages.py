"""Issue 23 through the whole DAG in five real scripts: a corpus spoken by espeak-ng per language, a tiny
model trained with ``paths.alphabet: auto`` (Mandarin with ``model.output: bytes``), exported, and the
client's transcript (the Transcribe task: ``native_client`` on the export) checked.

An untrained tiny model says little, so what is checked is what must hold whatever it says: the pipeline
completes; the alphabet holds the script's letters once each, whatever normal form or case the
transcripts were written in; the training text is the normalised one; the export records the mode; the
client's transcript is NFC text whose characters all belong to the alphabet (for bytes: valid text of
the script, invalid byte sequences dropped). Normalisation and byte decoding are unit-tested in
test_text.py and test_alphabet.py.

Needs espeak-ng (Debian: espeak-ng, which brings espeak-ng-data; make test installs it when run as root).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import luigi
import pytest
from rapidfuzz.distance import Levenshtein

from native_client.alphabet import load_alphabet
from native_client.metadata import load_metadata
from pipeline.config_loader import load_config
from pipeline.evaluation.metrics import headline_metric
from pipeline.features.cache import read_cache
from pipeline.layout import Layout
from pipeline.reports import AlphabetReport, EvaluationReport, read_report
from tasks import Evaluate, Export, Transcribe


@dataclass(frozen=True)
class Language:
    """One test corpus: the espeak-ng voice, its transcripts (spoken as written), the ``data.text`` and
    ``model`` settings of its config."""

    name: str
    voice: str
    sentences: tuple[str, ...]
    text: dict = field(default_factory=dict)
    output: str = "characters"


NFD = "NFD"
LANGUAGES = {
    # Half the transcripts decomposed (e + U+0301, as some tools write them): the alphabet must not care.
    "french": Language(
        "french",
        "fr",
        ("Le café est prêt", "Où est la forêt", "L'élève a noté", "Noël à la plage", "Ça va très bien"),
    ),
    "german": Language(
        "german",
        "de",
        ("Die Straße ist groß", "Grüße aus Köln", "Der Fuß tut weh", "SCHÖNE Äpfel", "Ich heiße Anna"),
    ),
    # Turkish lower-casing: İ -> i, I -> ı (str.lower would give i + U+0307 and i).
    "turkish": Language(
        "turkish",
        "tr",
        ("İstanbul çok güzel", "Işık yanıyor", "IĞDIR ili", "Bugün hava güzel", "İyi akşamlar"),
        text={"language": "tr"},
    ),
    "russian": Language(
        "russian", "ru", ("Привет мир", "Москва большая", "Ёлка стоит", "Спасибо друг", "Хорошая погода")
    ),
    "mandarin": Language(
        "mandarin", "cmn", ("今天天气很好", "我爱北京", "你好世界", "谢谢你们", "我们去学校"), output="bytes"
    ),
}


def espeak_corpus(root: Path, language: Language) -> dict[str, Path]:
    """A corpus of ``language`` spoken by espeak-ng under ``root``: every sentence in train and the last two
    in test (a corpus this small is there to run the stages, not to generalise; no dev split, so Train
    skips validation); the French transcripts of odd rows written in NFD. Returns the manifests by split."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed: apt-get install espeak-ng (make test does, run as root)")
    root.mkdir(parents=True)
    rows = []
    for index, sentence in enumerate(language.sentences):
        audio = root / f"{index:02d}.wav"
        subprocess.run([espeak, "-v", language.voice, "-s", "190", "-w", str(audio), sentence], check=True)
        written = (
            unicodedata.normalize(NFD, sentence) if language.name == "french" and index % 2 else sentence
        )
        rows.append((audio.name, audio.stat().st_size, written))
    manifests = {}
    for split, chosen in (("train", rows), ("test", rows[-2:])):
        manifests[split] = root / f"{split}.csv"
        with open(manifests[split], "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["wav_filename", "wav_filesize", "transcript"])
            writer.writerows(chosen)
    return manifests


def language_config(tmp_path: Path, language: Language, manifests: dict[str, Path]) -> Path:
    """A tiny config: alphabet auto, nothing else language-specific but ``language``'s own settings; greedy
    decoding, except Mandarin (no word spaces): lexicon-free beam search over a byte LM."""
    decoder = (
        "decoder: {lexicon: false, lm_builder: python, char_lm_order: 4, beam_width: 16}"
        if language.output == "bytes"
        else "decoder: {type: greedy}"
    )
    text = json.dumps(language.text) if language.text else "{}"
    path = tmp_path / f"{language.name}.yaml"
    path.write_text(
        textwrap.dedent(f"""
        paths: {{work_dir: {tmp_path / "work"}, export_dir: {tmp_path / "export"}, alphabet: auto}}
        data:
          train_files: [{manifests["train"]}]
          test_files: [{manifests["test"]}]
          text: {text}
        features: {{resample: true, workers: 1, numcep: 13, nfilt: 20}}
        model: {{n_hidden: 16, n_context: 2, dropout_rate: 0.0, output: {language.output}}}
        training: {{epochs: 1, batch_size: 5, dev_batch_size: 5, report_count: 1}}
        early_stop: {{rule: "off"}}
        export: {{n_steps: 4}}
        """)
        + decoder
        + "\n"
    )
    return path


def _letters(text: str) -> set[str]:
    return set(text) - {" "}


@pytest.mark.parametrize("name", list(LANGUAGES))
def test_a_language_trains_through_the_dag_and_the_client_speaks_its_script(name, tmp_path, tasks_in_process):
    language = LANGUAGES[name]
    manifests = espeak_corpus(tmp_path / "corpus", language)
    path = language_config(tmp_path, language, manifests)
    config = load_config(path)
    layout = Layout(config)
    clip = manifests["test"].parent / "04.wav"
    tasks = [Transcribe(config=str(path), audio=str(clip))]
    if language.output == "bytes":
        tasks.append(Evaluate(config=str(path)))
    assert luigi.build(tasks, local_scheduler=True)

    normalised = read_cache(layout.features_cache("train"), config.features).transcripts
    assert all(unicodedata.is_normalized("NFC", t) for t in normalised)
    metadata = load_metadata(layout.export_root)
    assert metadata.raw["output"] == language.output and metadata.output == language.output
    assert metadata.text is not None and metadata.text.language == language.text.get("language", "")
    record = json.loads(next((layout.export_root / "transcripts").glob("*.json")).read_text(encoding="utf-8"))
    transcript = record["text"]
    assert isinstance(transcript, str) and unicodedata.is_normalized("NFC", transcript)
    assert "\ufffd" not in transcript

    if language.output == "bytes":
        # No alphabet: 255 byte labels + blank; the script has no word spaces, so CER leads the reports.
        assert metadata.n_classes == 256 and not (layout.export_root / "alphabet.txt").exists()
        assert not layout.alphabet_files.root.exists()
        assert headline_metric(normalised) == "cer"
        report = read_report(layout.evaluation_report(layout.evaluate_dir), EvaluationReport)
        assert report.headline == "cer" and report.cer_lm is not None
        # (an untrained byte model may emit any byte: ASCII as much as pieces of characters; the pieces
        # that make no character are dropped, what is left is text; test_mandarin_bytes_model_writes_chinese
        # trains one long enough to write the script)
        assert not any(unicodedata.category(c) in ("Cc", "Cs", "Co") for c in transcript)
        assert record["reference"] == language.sentences[4]
        return

    alphabet = load_alphabet(layout.alphabet_files.alphabet)
    labels = set(alphabet.labels)
    assert len(alphabet.labels) == len(labels) and alphabet.labels[0] == " "
    assert labels == {" "} | {c for t in normalised for c in t}
    assert set(transcript) <= labels
    assert metadata.alphabet.labels == alphabet.labels
    report = read_report(layout.alphabet_files.report, AlphabetReport)
    assert report.rows == len(language.sentences) and not report.dropped
    # No combining marks and no upper case: one label per letter whatever form the transcripts were in.
    assert not any(unicodedata.combining(c) or c.isupper() for c in labels)
    if name == "french":
        assert {"é", "è", "ê", "à", "ù", "ç", "ë", "'"} <= labels
        assert "l'élève a noté" in normalised and "le café est prêt" in normalised
    elif name == "german":
        assert {"ß", "ü", "ö", "ä"} <= labels and "schöne äpfel" in normalised
    elif name == "turkish":
        assert {"ı", "i", "ş", "ğ", "ç", "ü"} <= labels
        assert {"istanbul çok güzel", "ışık yanıyor", "ığdır ili"} <= set(normalised)
    elif name == "russian":
        assert all(unicodedata.name(c).startswith("CYRILLIC") for c in labels - {" "})
        assert "ё" in labels and "привет мир" in normalised
    # Transcribe's reference is the manifest's transcript normalised as the training text was
    spoken = {"turkish": "iyi akşamlar"}.get(
        name, unicodedata.normalize("NFC", language.sentences[4]).lower()
    )
    assert record["reference"] == spoken


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("LANGUAGES_LONG"),
    reason="two minutes of training, beyond make test's budget: LANGUAGES_LONG=1 pytest -k mandarin_bytes",
)
def test_mandarin_bytes_model_writes_chinese(tmp_path, tasks_in_process):
    """Done-when of issue 23: a Mandarin config with ``model.output: bytes`` trains end to end and the
    client prints Chinese characters. 200 steps on the five clips (about two minutes on two cores) take
    the byte model far enough for the lexicon-free beam search over the byte LM to write most of them."""
    language = LANGUAGES["mandarin"]
    manifests = espeak_corpus(tmp_path / "corpus", language)
    tiny = language_config(tmp_path, language, manifests)
    path = tmp_path / "longer.yaml"
    path.write_text(
        textwrap.dedent(f"""
        extends: {tiny.name}
        features: {{numcep: 26, nfilt: 26, normalize: true}}
        model: {{n_hidden: 96, n_context: 5}}
        training: {{epochs: 200, learning_rate: 0.005}}
        decoder: {{char_lm_order: 6, beam_width: 32}}
        """)
    )
    assert luigi.build([Export(config=str(path))], local_scheduler=True)
    clips = sorted(manifests["train"].parent.glob("*.wav"))
    audio = [arg for clip in clips for arg in ("--audio", str(clip))]
    client = subprocess.run(
        [sys.executable, "-m", "native_client", "--model", str(tmp_path / "export"), *audio, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert client.returncode == 0, client.stderr
    texts = [json.loads(line)["text"] for line in client.stdout.splitlines()]
    assert len(texts) == len(language.sentences)
    assert all(unicodedata.is_normalized("NFC", t) for t in texts)
    ideographs = [
        [unicodedata.name(c, "").startswith("CJK UNIFIED IDEOGRAPH") for c in _letters(t)] for t in texts
    ]
    assert all(all(flags) for flags in ideographs), texts  # nothing but Chinese characters (and spaces)
    assert sum(bool(flags) for flags in ideographs) >= 3, texts
    errors = sum(
        Levenshtein.distance(ref, hyp.replace(" ", ""))
        for ref, hyp in zip(language.sentences, texts, strict=True)
    )
    assert errors / sum(map(len, language.sentences)) < 0.8, texts
