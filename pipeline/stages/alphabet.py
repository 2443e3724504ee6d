"""The Alphabet stage (``paths.alphabet: auto``): the alphabet of the normalised training transcripts.

The training manifests (``data.train_files`` and every imported corpus's train manifest, the first
``data.limit_train`` rows, as Features reads them; with ``multitask.sharing: shared``, every task's) are
streamed one row at a time; each transcript goes
through the one text normalisation (``data.text``) and its characters are counted. Characters seen fewer
than ``data.alphabet_min_count`` times are left out; the report lists each with its count and the rows
holding it, which Features will reject as ``unknown_characters``. Only counts per character live in
memory, and, for a character still under the minimum, the rows it is in (at most the minimum each).

The alphabet: the space first (label 0, as DeepSpeech's; the decoders' word separator, always there
even when no transcript has one), then every other character in code point order, so the same text
always gives the same alphabet. Written to ``alphabet.txt``, then ``alphabet_report.json`` with the
file's SHA-256 (its presence means the stage finished); every stage that loads the alphabet
(``pipeline.model.labels.model_alphabet``) checks that digest.
"""

from __future__ import annotations

import hashlib
import logging
import time
import unicodedata
from collections import Counter
from collections.abc import Callable

from native_client.alphabet import Alphabet
from pipeline.config import Config
from pipeline.dag import Node, Stage, is_instance, manifests_of, shared_alphabet, task_config, task_param
from pipeline.data.manifests import iter_transcripts
from pipeline.data.text import TranscriptRejected
from pipeline.files import write_text_atomic
from pipeline.layout import Layout
from pipeline.locks import stage_lock
from pipeline.model.labels import alphabet_intact
from pipeline.reports import AlphabetReport, read_report, write_report
from pipeline.workdir import ALPHABET_DIR, AlphabetFiles

log = logging.getLogger(__name__)

# How many of the rows a left-out character costs the report names.
EXAMPLES = 10
PROGRESS_EVERY = 10_000


def _alphabet_upstream(config: Config, params: dict) -> list[Node]:
    """What the Alphabet stage reads: the task's imports; with one shared alphabet, every task's."""
    if shared_alphabet(config) and not task_param(params):
        return [node for task in config.tasks for node in manifests_of(config, {"task": task}, "train")]
    return manifests_of(config, params, "train")


def _alphabet_runs(config: Config, params: dict) -> bool:
    """Whether the pipeline has this Alphabet instance: the task's alphabet is built (``auto``), by an
    instance of its own, or by the one without a task that every task shares."""
    if shared_alphabet(config):
        return not task_param(params) and config.task_view(config.tasks[0]).alphabet_auto
    return is_instance(config, params) and task_config(config, params).alphabet_auto


STAGE = Stage(
    "alphabet",
    "Alphabet",
    params=("task",),
    upstream=_alphabet_upstream,
    runs=_alphabet_runs,
    directory=ALPHABET_DIR,
    outputs=lambda layout, params: [layout.alphabet_files.root],
)


def _describe(char: str, count: int) -> dict:
    return {
        "char": char,
        "codepoint": f"U+{ord(char):04X}",
        "name": unicodedata.name(char, "unnamed"),
        "count": count,
    }


def alphabet_stage(layout: Layout, progress: Callable[[int], None] | None = None) -> AlphabetReport:
    """Build the alphabet of ``layout``'s training transcripts into its Alphabet directory unless an intact
    one is there; returns the report. ``progress(rows)`` follows the rows read."""
    files = layout.alphabet_files
    with stage_lock(files.root):
        if alphabet_intact(files):
            return read_report(files.report, AlphabetReport)
        return _build(layout, files, progress)


def _build(layout: Layout, files: AlphabetFiles, progress: Callable[[int], None] | None) -> AlphabetReport:
    config = layout.config
    started = time.time()
    min_count = config.data.alphabet_min_count
    counts: Counter = Counter()
    rejected: Counter = Counter()
    # Rows (index, file:line) of each character while it is under the minimum: at most min_count - 1 each.
    rare_rows: dict[str, list[tuple[int, str]]] = {}
    rows = 0
    transcripts = (
        item
        for manifests, limit, text_settings in layout.alphabet_sources()
        for item in iter_transcripts(manifests, limit, text_settings)
    )
    for rows, (source, text) in enumerate(transcripts, start=1):
        if progress and rows % PROGRESS_EVERY == 0:
            progress(rows)
        if isinstance(text, TranscriptRejected):
            rejected[text.reason] += 1
            continue
        counts.update(text)
        if min_count > 1:
            for char in set(text):
                if counts[char] < min_count:
                    rare_rows.setdefault(char, []).append((rows, source))
                else:
                    rare_rows.pop(char, None)
    if progress:
        progress(rows)
    if not counts:
        raise ValueError(
            f"{config.source}: paths.alphabet: auto found no training transcripts to build the alphabet from "
            f"({rows} rows read; check data.train_files and data.corpora)"
        )
    kept = sorted((c for c in counts if counts[c] >= min_count and c != " "), key=ord)
    dropped = sorted((c for c in counts if counts[c] < min_count), key=lambda c: (-counts[c], ord(c)))
    lost = sorted({row for char in dropped for row in rare_rows.get(char, ())})
    alphabet = Alphabet((" ", *kept))
    text = (
        "# Built by the Alphabet stage from the normalised training transcripts (data.text, "
        f"data.alphabet_min_count {min_count}); see {files.report.name}.\n" + alphabet.to_text()
    )
    files.root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(files.alphabet, text)
    report = AlphabetReport(
        fingerprint=layout.fingerprint("alphabet"),
        labels=alphabet.size,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        rows=rows,
        rows_rejected=dict(rejected),
        min_count=min_count,
        characters=[_describe(c, counts[c]) for c in alphabet.labels],
        dropped=[{**_describe(c, counts[c]), "rows": len(rare_rows.get(c, ()))} for c in dropped],
        rows_lost=len(lost),
        rows_lost_examples=[source for _, source in lost[:EXAMPLES]],
        text=config.data.text.to_dict(),
        wall_time_s=round(time.time() - started, 2),
    )
    write_report(files.report, report)
    log.info(
        "Alphabet: %d labels from %d rows%s",
        alphabet.size,
        rows,
        f"; left out (seen fewer than {min_count} times): "
        + " ".join(f"{d['char']!r} ({d['count']}, {d['rows']} rows)" for d in report.dropped)
        + f", costing {len(lost)} rows"
        if dropped
        else "",
    )
    return report
