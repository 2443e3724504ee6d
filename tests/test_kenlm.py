"""KenLM's own tools: the built-in estimator checked against lmplz, and binary LMs through the pipeline.

Needs ``make kenlm`` (CI builds the tools); skipped where they are not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import luigi
import pytest

from native_client.alphabet import load_alphabet
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.lm.kenlm_tools import find_tools, run_lmplz
from pipeline.lm.kneser_ney import estimate, write_arpa
from pipeline.lm.text import lm_sentences
from tests.conftest import ALPHABET, ROOT, SAMPLE

pytestmark = pytest.mark.skipif(find_tools() is None, reason="KenLM's tools are not installed (make kenlm)")


def read_arpa(path: Path) -> dict[tuple[str, ...], tuple[float, float]]:
    """Every n-gram of an ARPA file: (log10 probability, log10 backoff; 0 when absent)."""
    entries, order = {}, 0
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line.endswith("-grams:"):
            order = int(line[1 : line.index("-")])
        elif order and line and not line.startswith("\\"):
            fields = line.split("\t")
            words = tuple(fields[1].split())
            assert len(words) == order, line
            entries[words] = (float(fields[0]), float(fields[2]) if len(fields) > 2 else 0.0)
    return entries


@pytest.fixture(scope="module")
def sample_text(tmp_path_factory) -> list[str]:
    path = tmp_path_factory.mktemp("lmtext") / "config.yaml"
    path.write_text(
        f"paths:\n  alphabet: {ALPHABET}\ndecoder:\n  lm_corpus_files: [{SAMPLE / 'lm_corpus.txt'}]\n"
        f"  lm_include_train: false\n"
    )
    return list(lm_sentences(load_config(path), load_alphabet(ALPHABET), Counter()))


@pytest.mark.parametrize("order", [3, 5])
def test_the_python_estimator_agrees_with_lmplz_on_every_ngram(sample_text, tmp_path, order):
    ours, theirs = tmp_path / "python.arpa", tmp_path / "lmplz.arpa"
    write_arpa(estimate((s.split() for s in sample_text), order), ours)
    run_lmplz(
        find_tools()["lmplz"],
        iter(sample_text),
        theirs,
        order,
        "500M",
        tmp_path / "sort",
        (),
        tmp_path / "log",
    )
    mine, reference = read_arpa(ours), read_arpa(theirs)
    assert set(mine) == set(reference), (
        len(set(mine) ^ set(reference)),
        sorted(set(mine) ^ set(reference))[:5],
    )
    for words, (prob, backoff) in reference.items():
        if words == ("<s>",):
            continue  # both write -99 (never predicted); lmplz may round it differently
        assert abs(mine[words][0] - prob) <= 1e-4, (words, mine[words], (prob, backoff))
        assert abs(mine[words][1] - backoff) <= 1e-4, (words, mine[words], (prob, backoff))


@pytest.mark.usefixtures("tasks_in_process")
def test_language_model_task_builds_a_binary_with_kenlm_and_the_export_ships_it(small_config, tmp_path):
    import kenlm

    from native_client import load_metadata
    from tasks import Export, LanguageModel

    extra = textwrap.dedent(f"""
        paths:
          export_dir: {tmp_path / "export"}
        training:
          epochs: 1
        decoder:
          lm_builder: kenlm
          lm_top_k: 3000
          beam_width: 8
    """)
    path = small_config(limit_train=8, limit_dev=4, limit_test=4, extra=extra)
    assert luigi.build([LanguageModel(config=str(path))], local_scheduler=True)
    lm = Layout(load_config(path)).lm
    report = json.loads(lm.report.read_text())
    assert report["builder"] == "kenlm" and report["lm"] == "lm.binary" and report["held_out_overlap"] == 0
    assert report["vocabulary"] == 3000 and len(lm.vocabulary.read_text().split()) == 3000
    assert not lm.word_arpa.exists() and not lm.sort_space.exists()  # intermediates are gone
    model = kenlm.Model(str(lm.word_binary))
    assert model.order == 3
    assert model.score("and he said unto them", bos=True, eos=True) > model.score(
        "them unto said he and", bos=True, eos=True
    )

    assert luigi.build([Export(config=str(path))], local_scheduler=True)
    metadata = load_metadata(tmp_path / "export")
    assert metadata.decoder["lm"] == "lm.binary" and (metadata.directory / "lm.binary").is_file()
    clip = str(SAMPLE / "test" / "00001.flac")
    for scorer in ([], ["--scorer", str(lm.word_binary)]):
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "native_client",
                "--model",
                str(metadata.directory),
                "--audio",
                clip,
                *scorer,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        vocabulary = set(lm.vocabulary.read_text().split())
        assert set(run.stdout.split()) <= vocabulary


def test_a_missing_tool_or_a_failing_lmplz_is_one_clear_error(tmp_path):
    from pipeline.lm.kenlm_tools import KenLMToolError

    with pytest.raises(KenLMToolError, match=r"lmplz exited with status .*full output in .*log"):
        run_lmplz(
            find_tools()["lmplz"],
            iter(["a b c"]),
            tmp_path / "x.arpa",
            3,
            "not-a-size",
            tmp_path / "s",
            (),
            tmp_path / "log",
        )
