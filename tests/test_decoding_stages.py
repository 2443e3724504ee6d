"""LanguageModel, TuneDecoder, Evaluate with the LM, and the LM inside the export and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import kenlm
import luigi
import pytest

from native_client import Model, load_metadata, open_model
from native_client.decoders.beam import BeamDecoder
from native_client.export_decoder import decoder_for_export
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.lm.kneser_ney import LanguageModelError
from pipeline.stages.language_model import language_model_stage
from pipeline.workdir import LMFiles
from tasks import Evaluate, Export, LanguageModel, Transcribe
from tests.conftest import ROOT, SAMPLE

pytestmark = pytest.mark.usefixtures("tasks_in_process")

ECHO = "tests.plugins.echo_decoder"  # a decoder of the user's own (see tests/plugins)


def test_language_model_task_writes_an_arpa_kenlm_reads(small_config):
    path = small_config(limit_train=10, extra="decoder:\n  lm_builder: python\n")
    assert luigi.build([LanguageModel(config=str(path))], local_scheduler=True)
    config = load_config(path)
    directory = Layout(config).lm.root
    report = json.loads((directory / "lm_report.json").read_text())
    assert (
        report["corpus_lines"] == 20000
        and report["train_transcripts"] == 10
        and report["held_out_overlap"] == 0
    )
    model = kenlm.Model(str(directory / "lm.arpa"))
    assert (
        model.order == 3
        and report["ngrams"]["1"] == len(list((directory / "vocab.txt").read_text().split())) + 3
    )
    assert model.score("and he said unto them", bos=True, eos=True) > model.score(
        "them unto said he and", bos=True, eos=True
    )


def test_language_model_refuses_held_out_text_and_adopts_a_given_lm(small_config, tmp_path):
    leaky = load_config(
        small_config("leaky.yaml", extra=f"decoder:\n  lm_corpus_files: [{SAMPLE / 'test.csv'}]\n")
    )
    with pytest.raises(LanguageModelError, match="test.csv is a dev/test manifest"):
        language_model_stage(Layout(leaky), files=LMFiles(tmp_path / "leaky"))
    assert not (tmp_path / "leaky").exists() and not (tmp_path / "leaky.partial").exists()
    arpa = tmp_path / "mine.arpa"
    arpa.write_text(
        "\\data\\\nngram 1=4\n\n\\1-grams:\n-99\t<s>\t0\n-1\t</s>\n-1\t<unk>\n-0.5\tamen\n\n\\end\\\n"
    )
    given = load_config(
        small_config(
            "given.yaml",
            extra=f"decoder:\n  lm_path: {arpa}\n  lm_include_train: false\n  lm_corpus_files: []\n",
        )
    )
    report = language_model_stage(Layout(given), files=LMFiles(tmp_path / "given"))
    assert report.lm == str(arpa) and (tmp_path / "given" / "vocab.txt").read_text() == "amen\n"


def _tiny_pipeline(small_config, extra: str = ""):
    return small_config(
        limit_train=16,
        limit_dev=6,
        limit_test=6,
        extra=textwrap.dedent("""
        training:
          epochs: 2
          learning_rate: 0.003
        decoder:
          beam_width: 16
          tune_trials: 3
    """)
        + textwrap.dedent(extra),
    )


def test_tune_evaluate_and_export_use_the_lm(small_config, tmp_path):
    path = _tiny_pipeline(small_config, f"paths:\n  export_dir: {tmp_path / 'export'}\n")
    path.write_text(path.read_text().replace("  tune_trials: 3\n", "  tune_trials: 3\n  tune: true\n"))
    assert luigi.build([Evaluate(config=str(path)), Export(config=str(path))], local_scheduler=True)
    config = load_config(path)
    tuned = json.loads((Layout(config).tune_dir / "tune.json").read_text())
    assert len(tuned["trials"]) == 3 and tuned["trials"][0]["lm_alpha"] == config.decoder.lm_alpha
    best = tuned["best"]
    assert best["wer"] == min(t["wer"] for t in tuned["trials"]) and 0 <= best["lm_alpha"] <= 5
    evaluation = json.loads((Layout(config).evaluate_dir / "evaluation.json").read_text())
    assert {"wer", "cer", "wer_lm", "cer_lm"} <= set(evaluation)
    assert (
        evaluation["decoder_lm"]["lm_alpha"] == best["lm_alpha"]
        and evaluation["decoder_lm"]["beam_width"] == 16
    )
    metadata = load_metadata(tmp_path / "export")
    assert metadata.decoder["lm_alpha"] == best["lm_alpha"] and metadata.decoder["tuned"] is True
    assert (metadata.directory / metadata.decoder["lm"]).is_file() and (
        metadata.directory / "vocab.txt"
    ).is_file()
    model = open_model(metadata.directory, decoder_factory=decoder_for_export)
    assert isinstance(model.decoder, BeamDecoder) and model.decoder.settings.lm_alpha == best["lm_alpha"]
    assert isinstance(Model(metadata.directory).decoder, type(model.greedy))

    clip = str(SAMPLE / "test" / "00001.flac")
    runs = {}
    lm = Layout(config).lm
    scorer = lm.resolve(json.loads(lm.report.read_text())["lm"])
    for flag in ([], ["--no-scorer"], ["--scorer", str(scorer), "--beam-width", "4"]):
        script = textwrap.dedent(f"""
            import sys
            from native_client.__main__ import main
            from native_client import model
            code = main(["--model", {str(metadata.directory)!r}, "--audio", {clip!r}] + {flag!r})
            assert "luigi" not in sys.modules and "pipeline" not in sys.modules
            sys.exit(code)
        """)
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert run.returncode == 0, run.stderr
        runs[" ".join(flag[:1])] = run.stdout.strip()
    # with the LM every word is a vocabulary word; greedy output has no such guarantee
    vocabulary = set((metadata.directory / "vocab.txt").read_text().split())
    assert set(runs[""].split()) <= vocabulary and set(runs["--scorer"].split()) <= vocabulary

    # decoder.type names a module of the user's own: TuneDecoder, Evaluate (in 2 spawned workers), the
    # export and the client decode with it; the model, the features and the LM are the beam run's.
    echo = path.with_name("echo.yaml")
    echo.write_text(
        f"extends: {path.name}\npaths:\n  export_dir: {tmp_path / 'echo-export'}\n"
        f"decoder:\n  type: {ECHO}\n  workers: 2\n"
    )
    transcribe = Transcribe(config=str(echo), audio=str(clip))
    assert luigi.build([Evaluate(config=str(echo)), transcribe], local_scheduler=True)
    layout = Layout(load_config(echo))
    assert (layout.train_fingerprint, layout.lm_fingerprint) == (
        Layout(config).train_fingerprint,
        Layout(config).lm_fingerprint,
    )
    tuned = json.loads(layout.tune_report.read_text())
    assert tuned["search"]["decoder"] == ECHO
    alpha, beta = tuned["best"]["lm_alpha"], tuned["best"]["lm_beta"]
    evaluation = json.loads((layout.evaluate_dir / "evaluation.json").read_text())
    assert evaluation["decoder_lm"]["type"] == ECHO and evaluation["decoder_lm"]["lm_alpha"] == alpha
    lines = (layout.evaluate_dir / evaluation["samples_lm_file"]).read_text().splitlines()
    for sample in map(json.loads, lines):
        pid, weights = sample["hypothesis"].split(" ", 1)
        assert int(pid) != os.getpid() and weights.startswith(f"{alpha:g} {beta:g}")
    metadata = load_metadata(tmp_path / "echo-export")
    assert metadata.decoder["type"] == ECHO and metadata.decoder["lm_alpha"] == alpha
    record = json.loads(Path(transcribe.output().path).read_text())
    assert record["decoder"] == "echo" and record["text"].startswith(f"{os.getpid()} {alpha:g} {beta:g}")
    model = open_model(metadata.directory, decoder_factory=lambda m: decoder_for_export(m, allowed=[ECHO]))
    assert model.decoder.name == "echo"
