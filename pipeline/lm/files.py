"""The LanguageModel stage's files as its report records them: built or not, intact or not."""

from __future__ import annotations

from pathlib import Path

from pipeline.digests import file_digest
from pipeline.reports import LMReport, read_report
from pipeline.workdir import LMFiles


class LanguageModelDamaged(RuntimeError):
    """A file the LanguageModel stage wrote was changed, truncated or removed since."""


def lm_built(lm: LMFiles) -> bool:
    """Whether the LanguageModel stage that writes ``lm`` has finished (its report exists)."""
    return lm.report.is_file()


def lm_file_records(directory: Path, names) -> dict:
    """{name: size, modification time and SHA-256} of the stage files ``names`` in ``directory``."""
    records = {}
    for name in names:
        stat = (directory / name).stat()
        records[name] = {
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": file_digest(directory / name),
        }
    return records


def verify_lm_files(lm: LMFiles, deep: bool) -> None:
    """Check the LanguageModel stage's files against its report: size and modification time (cheap,
    for ``complete()``), and with ``deep`` their SHA-256 too (before a stage reads them). Raises
    LanguageModelDamaged naming the first file that differs."""
    report = read_lm_report(lm)
    for name, record in (report.files or {}).items():
        path = lm.root / name
        redo = "make rerun STAGE=LanguageModel (or delete the directory) to build it again"
        try:
            stat = path.stat()
        except OSError:
            raise LanguageModelDamaged(f"{path}: missing; {redo}") from None
        if stat.st_size != record["size"]:
            raise LanguageModelDamaged(
                f"{path}: {stat.st_size} bytes, the LM report says {record['size']}; {redo}"
            )
        if stat.st_mtime_ns != record["mtime_ns"] and not deep:
            raise LanguageModelDamaged(f"{path}: modified after the LanguageModel stage wrote it; {redo}")
        if deep and file_digest(path) != record["sha256"]:
            raise LanguageModelDamaged(f"{path}: its SHA-256 differs from the LM report's; {redo}")


def read_lm_report(lm: LMFiles) -> LMReport:
    """The LanguageModel report in ``lm`` (ReportError naming the file when missing or damaged)."""
    return read_report(lm.report, LMReport)
