"""The LanguageModel stage: text -> normalised sentences -> word (and character) n-gram ARPA + vocabulary.

Text comes from ``decoder.lm_corpus_files`` plus, with ``decoder.lm_include_train``,
the training transcripts; dev and test transcripts are never used, and a corpus
file that is also a dev/test manifest is refused. A user LM (``decoder.lm_path``)
is used as it is; the stage then only writes the vocabulary.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from native_client.alphabet import Labels
from native_client.arpa import arpa_counts, arpa_unigrams, is_arpa
from pipeline.config import is_transducer
from pipeline.dag import Stage, alphabet_of, every_split_of, is_instance, task_config
from pipeline.files import fsync_path, fsync_tree, write_text_atomic
from pipeline.layout import Layout
from pipeline.lm.files import LanguageModelDamaged, lm_file_records, verify_lm_files
from pipeline.lm.kenlm_tools import TOOLS_MISSING, build_binary, filter_vocabulary, find_tools, run_lmplz
from pipeline.lm.kneser_ney import LanguageModelError, estimate, write_arpa
from pipeline.lm.text import HeldOutCheck, char_tokens, lm_sentences
from pipeline.locks import stage_lock
from pipeline.model.labels import model_alphabet
from pipeline.reports import LMReport, read_report, write_report
from pipeline.workdir import LM_DIR, LMFiles

log = logging.getLogger(__name__)


STAGE = Stage(
    "lm",
    "LanguageModel",
    params=("task",),
    upstream=lambda config, params: [*every_split_of(config, params), *alphabet_of(config, params)],
    # a transducer reads no LM (shallow fusion is not built)
    runs=lambda config, params: (
        is_instance(config, params) and not is_transducer(task_config(config, params))
    ),
    # decoder.lm_builder as written: auto stays auto whichever builder it finds (lm_report.json says which).
    derived=lambda inputs, params: {"lm_builder": inputs.config.decoder.lm_builder},
    directory=LM_DIR,
    outputs=lambda layout, params: [layout.lm.root, layout.lm.staging],
)


def language_model_stage(
    layout: Layout,
    on_status: Callable[[str, float], None] = lambda message, percent: None,
    files: LMFiles | None = None,
) -> LMReport:
    """Write ``lm.arpa`` (or use ``decoder.lm_path``), ``chars.arpa`` when ``decoder.lexicon`` is off,
    the vocabulary and the report into ``files`` (default: the fingerprinted LanguageModel directory)."""
    files = files or layout.lm
    with stage_lock(files.root):
        if files.report.is_file() and files == layout.lm and lm_intact(layout):
            return read_report(files.report, LMReport)  # another pipeline sharing this LM built it meanwhile
        staging = LMFiles(files.staging)
        shutil.rmtree(staging.root, ignore_errors=True)
        staging.root.mkdir(parents=True)
        try:
            report = _build(layout, staging, on_status)
        except BaseException:
            shutil.rmtree(staging.root, ignore_errors=True)
            raise
        shutil.rmtree(files.root, ignore_errors=True)
        fsync_tree(staging.root)  # the files reach the disk before the rename that publishes them
        staging.root.rename(files.root)
        fsync_path(files.root.parent)
    log.info("Language model: %s", {k: v for k, v in dataclasses.asdict(report).items() if k != "discounts"})
    return report


def lm_intact(layout: Layout) -> bool:
    """Whether the LanguageModel stage's files are as its report recorded them (size and modification
    time); a changed one is named in a warning."""
    try:
        verify_lm_files(layout.lm, deep=False)
    except LanguageModelDamaged as error:
        log.warning("%s", error)
        return False
    return True


def lm_builder(wanted: str) -> str:
    """``kenlm`` or ``python``: ``decoder.lm_builder`` (``wanted``), with ``auto`` resolved on this machine
    when the stage runs: KenLM's tools when they are installed (beside this Python or on PATH), else the
    built-in estimator. The LM's report records which (its fingerprint holds ``auto``, never the
    machine's answer)."""
    if wanted != "auto":
        return wanted
    return "kenlm" if find_tools() is not None else "python"


def _build(layout: Layout, staging: LMFiles, on_status: Callable[[str, float], None]) -> LMReport:
    config = layout.config
    alphabet = model_alphabet(layout.config, layout.alphabet)
    decoder = config.decoder
    started = time.time()
    stats: Counter = Counter()
    manifests = {split: layout.split_manifests(split) for split in ("train", "dev", "test")}
    held_out = HeldOutCheck(config, alphabet, manifests)
    has_text = bool(decoder.lm_corpus_files or decoder.lm_include_train)

    def text() -> Iterator[str]:
        """The LM text, streamed (each pass reads the corpus files again)."""
        stats.clear()
        if has_text:
            for sentence in lm_sentences(config, alphabet, stats, manifests):
                held_out.see(sentence)
                yield sentence

    builder = "lm_path" if decoder.lm_path else lm_builder(decoder.lm_builder)
    if builder == "lm_path":
        built = _adopt(Path(decoder.lm_path), text())
    elif builder == "kenlm":
        built = _build_with_kenlm(decoder, staging, text, on_status, alphabet)
    else:
        built = _build_with_python(decoder, staging, text, on_status, alphabet)
    words = built.pop("vocabulary")
    write_text_atomic(staging.vocabulary, "".join(w + "\n" for w in words))
    shutil.rmtree(staging.sort_space, ignore_errors=True)
    written = [
        name
        for name in (built["lm"], built.get("char_lm"), staging.vocabulary.name)
        if name and not Path(name).is_absolute()
    ]
    report = LMReport(
        fingerprint=layout.lm_fingerprint,
        order=decoder.lm_order,
        held_out_overlap=held_out.overlap,
        wall_time_s=round(time.time() - started, 1),
        builder=builder,
        vocabulary=len(words),
        files=lm_file_records(staging.root, written),
        **stats,
        **built,
    )
    write_report(staging.report, report)
    return report


def _adopt(lm_path: Path, text: Iterator[str]) -> dict:
    """``decoder.lm_path`` as it is; the vocabulary from its unigrams (ARPA) or from the LM text (binary)."""
    if not lm_path.is_file():
        raise LanguageModelError(f"decoder.lm_path: {lm_path} does not exist")
    if is_arpa(lm_path):
        for _ in text:  # still read, for the held-out check and the counts
            pass
        return {
            "lm": str(lm_path.resolve()),
            "vocabulary": arpa_unigrams(lm_path),
            "vocabulary_source": "lm_path unigrams",
        }
    words = sorted({w for sentence in text for w in sentence.split()})
    return {
        "lm": str(lm_path.resolve()),
        "vocabulary": words,
        "vocabulary_source": "LM text (lm_path is a binary)",
    }


def _build_with_python(
    decoder,
    staging: LMFiles,
    text: Callable[[], Iterator[str]],
    on_status: Callable[[str, float], None],
    alphabet: Labels,
) -> dict:
    """The built-in modified Kneser-Ney estimator
    (counts in memory: for corpora up to some tens of millions of words)."""
    on_status("reading the LM text", 5)
    sentences = list(text())
    if not sentences:
        raise LanguageModelError("no LM text: set decoder.lm_corpus_files or decoder.lm_include_train")
    on_status(f"estimating the {decoder.lm_order}-gram word model from {len(sentences)} sentences", 20)
    model = estimate((s.split() for s in sentences), decoder.lm_order)
    write_arpa(model, staging.word_arpa)
    built = {
        "lm": staging.word_arpa.name,
        "ngrams": {str(n): len(model.prob[n]) + (1 if n == 1 else 0) for n in range(1, model.order + 1)},
        "discounts": {str(n): list(model.discounts[n]) for n in range(1, model.order + 1)},
        "discount_fallback_orders": model.fallback_orders,
        "vocabulary": [w for w, _ in Counter(w for s in sentences for w in s.split()).most_common()],
        "vocabulary_source": "LM text",
    }
    if not decoder.lexicon:
        on_status(f"estimating the {decoder.char_lm_order}-gram character model", 60)
        write_arpa(
            estimate((char_tokens(s, alphabet) for s in sentences), decoder.char_lm_order), staging.char_arpa
        )
        built["char_lm"] = staging.char_arpa.name
    return built


def _build_with_kenlm(
    decoder,
    staging: LMFiles,
    text: Callable[[], Iterator[str]],
    on_status: Callable[[str, float], None],
    alphabet: Labels,
) -> dict:
    """KenLM's lmplz on the streamed text, filter to the top-k words when asked, then build_binary."""
    tools = find_tools()
    if tools is None:
        raise LanguageModelError(TOOLS_MISSING)
    counts: Counter = Counter()

    def counted() -> Iterator[str]:
        for sentence in text():
            counts.update(sentence.split())
            yield sentence

    on_status(
        f"lmplz: estimating the {decoder.lm_order}-gram word model (sort memory {decoder.lm_memory})", 10
    )
    run_lmplz(
        tools["lmplz"],
        counted(),
        staging.word_arpa,
        decoder.lm_order,
        decoder.lm_memory,
        staging.sort_space,
        tuple(decoder.lm_prune),
        staging.build_log,
    )
    if not counts:
        raise LanguageModelError("no LM text: set decoder.lm_corpus_files or decoder.lm_include_train")
    vocabulary = [w for w, _ in counts.most_common()]
    arpa = staging.word_arpa
    if decoder.lm_top_k and decoder.lm_top_k < len(vocabulary):
        on_status(f"filter: keeping the {decoder.lm_top_k} most frequent words", 60)
        vocabulary = vocabulary[: decoder.lm_top_k]
        filter_vocabulary(tools["filter"], arpa, vocabulary, staging.filtered_arpa, staging.build_log)
        arpa = staging.filtered_arpa
    on_status("build_binary: writing the trie", 75)
    build_binary(
        tools["build_binary"], arpa, staging.word_binary, decoder.lm_quantize_bits, staging.build_log
    )
    built = {
        "lm": staging.word_binary.name,
        "ngrams": arpa_counts(arpa),
        "vocabulary": vocabulary,
        "vocabulary_source": "LM text" + (f" (top {decoder.lm_top_k})" if decoder.lm_top_k else ""),
    }
    if not decoder.lexicon:
        on_status(f"lmplz: estimating the {decoder.char_lm_order}-gram character model", 85)
        run_lmplz(
            tools["lmplz"],
            (" ".join(char_tokens(s, alphabet)) for s in text()),
            staging.char_arpa,
            decoder.char_lm_order,
            decoder.lm_memory,
            staging.sort_space,
            (),
            staging.build_log,
        )
        built["char_lm"] = staging.char_arpa.name
    for intermediate in {staging.word_arpa, arpa}:  # the binary replaces them (an ARPA can be tens of GB)
        intermediate.unlink(missing_ok=True)
    return built
