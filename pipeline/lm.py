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
from pathlib import Path
from typing import Callable, Iterator, Optional

from native_client.alphabet import Alphabet, load_alphabet
from native_client.arpa import arpa_unigrams, is_arpa
from native_client.beam import SPACE_TOKEN
from pipeline.config import Config
from pipeline.corpus import read_manifests
from pipeline.files import write_text_atomic
from pipeline.kneser_ney import LanguageModelError, estimate, write_arpa
from pipeline.layout import Layout, LMFiles
from pipeline.locks import stage_lock
from pipeline.reports import LMReport, read_report, write_report

log = logging.getLogger(__name__)


def clean_line(line: str, alphabet: Alphabet) -> str:
    """Normalise like transcripts (case, whitespace) and drop characters outside the alphabet."""
    text = alphabet.normalise(line)
    known = set(alphabet.labels)
    return " ".join("".join(ch for ch in text if ch in known).split())


def lm_sentences(config: Config, alphabet: Alphabet, stats: Counter) -> Iterator[str]:
    """The LM text, one normalised sentence per item; ``stats`` counts lines read, used and emptied."""
    held_out = {Path(f).resolve() for split in ("dev", "test") for f in config.split_files(split)}
    for path in config.decoder.lm_corpus_files:
        if Path(path).resolve() in held_out:
            raise LanguageModelError(f"decoder.lm_corpus_files: {path} is a dev/test manifest; "
                                     f"the LM must not see held-out text")
        try:
            handle = open(path, encoding="utf-8", errors="replace")
        except OSError as error:
            raise LanguageModelError(f"decoder.lm_corpus_files: {path}: {error.strerror}") from error
        with handle:
            for line in handle:
                stats["corpus_lines"] += 1
                sentence = clean_line(line, alphabet)
                if sentence:
                    stats["sentences"] += 1
                    yield sentence
                else:
                    stats["empty_lines"] += 1
    if config.decoder.lm_include_train:
        samples, _ = read_manifests(config.data.train_files, config.data.limit_train, alphabet)
        for sample in samples:
            stats["train_transcripts"] += 1
            stats["sentences"] += 1
            yield sample.transcript


def held_out_overlap(config: Config, alphabet: Alphabet, sentences: set[str]) -> int:
    """How many dev/test transcripts appear verbatim among the LM sentences (reported, should be 0)."""
    count = 0
    for split in ("dev", "test"):
        samples, _ = read_manifests(config.split_files(split), config.split_limit(split), alphabet)
        count += sum(1 for s in samples if s.transcript in sentences)
    return count


def char_tokens(sentence: str) -> list[str]:
    """A sentence as character tokens for the character LM (space written as ``SPACE_TOKEN``)."""
    return [SPACE_TOKEN if ch == " " else ch for ch in sentence]


def build_language_model(layout: Layout, on_status: Callable[[str, float], None] = lambda message, percent: None,
                         files: Optional[LMFiles] = None) -> LMReport:
    """Write ``lm.arpa`` (or use ``decoder.lm_path``), ``chars.arpa`` when ``decoder.lexicon`` is off,
    the vocabulary and the report into ``files`` (default: the fingerprinted LanguageModel directory)."""
    files = files or layout.lm
    with stage_lock(files.root):
        if files.report.is_file():  # another pipeline sharing this LM built it meanwhile
            return read_report(files.report, LMReport)
        staging = LMFiles(files.staging)
        shutil.rmtree(staging.root, ignore_errors=True)
        staging.root.mkdir(parents=True)
        try:
            report = _build(layout, staging, on_status)
        except BaseException:
            shutil.rmtree(staging.root, ignore_errors=True)
            raise
        shutil.rmtree(files.root, ignore_errors=True)
        staging.root.rename(files.root)
    log.info("Language model: %s", {k: v for k, v in dataclasses.asdict(report).items() if k != "discounts"})
    return report


def _build(layout: Layout, staging: LMFiles, on_status: Callable[[str, float], None]) -> LMReport:
    config = layout.config
    alphabet = load_alphabet(layout.alphabet)
    decoder = config.decoder
    started = time.time()
    stats: Counter = Counter()
    extra: dict = {}
    on_status("reading the LM text", 5)
    sentences = list(lm_sentences(config, alphabet, stats)) if (decoder.lm_corpus_files or decoder.lm_include_train) else []
    overlap = held_out_overlap(config, alphabet, set(sentences))
    if decoder.lm_path:
        lm_path = Path(decoder.lm_path)
        if not lm_path.is_file():
            raise LanguageModelError(f"decoder.lm_path: {lm_path} does not exist")
        lm = str(lm_path.resolve())
        arpa = is_arpa(lm_path)
        vocabulary = arpa_unigrams(lm_path) if arpa else sorted({w for s in sentences for w in s.split()})
        vocabulary_source = "lm_path unigrams" if arpa else "LM text (lm_path is a binary)"
    else:
        if not sentences:
            raise LanguageModelError("no LM text: set decoder.lm_corpus_files or decoder.lm_include_train")
        on_status(f"estimating the {decoder.lm_order}-gram word model from {len(sentences)} sentences", 20)
        model = estimate((s.split() for s in sentences), decoder.lm_order)
        write_arpa(model, staging.word_arpa)
        lm = staging.word_arpa.name
        extra["ngrams"] = {str(n): len(model.prob[n]) + (1 if n == 1 else 0) for n in range(1, model.order + 1)}
        extra["discounts"] = {str(n): list(model.discounts[n]) for n in range(1, model.order + 1)}
        extra["discount_fallback_orders"] = model.fallback_orders
        counts = Counter(w for s in sentences for w in s.split())
        vocabulary = [w for w, _ in counts.most_common()]
        vocabulary_source = "LM text"
    if not decoder.lexicon:
        on_status(f"estimating the {decoder.char_lm_order}-gram character model", 60)
        chars = estimate((char_tokens(s) for s in sentences), decoder.char_lm_order)
        write_arpa(chars, staging.char_arpa)
        extra["char_lm"] = staging.char_arpa.name
    write_text_atomic(staging.vocabulary, "".join(w + "\n" for w in vocabulary))
    report = LMReport(fingerprint=layout.lm_fingerprint, order=decoder.lm_order, lm=lm, vocabulary=len(vocabulary),
                      vocabulary_source=vocabulary_source, held_out_overlap=overlap,
                      wall_time_s=round(time.time() - started, 1), **stats, **extra)
    write_report(staging.report, report)
    return report
