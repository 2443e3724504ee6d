"""What a person sees on the terminal: one line per error, the traceback only in the run's log file."""

from __future__ import annotations

import logging
import os


class OneLineFormatter(logging.Formatter):
    """A formatter that shows an exception as its last line, ``Type: message`` (the project's errors
    already say which file or key is wrong and what to do), and points to the log file that keeps the
    whole traceback. Named in tasks/logging.ini for the console handler."""

    def format(self, record: logging.LogRecord) -> str:
        """The record with its exception shortened; the record keeps no cached text, so that the log
        file's handler still writes the whole traceback."""
        saved = record.exc_text
        record.exc_text = None
        try:
            return super().format(record)
        finally:
            record.exc_text = saved

    def formatException(self, exc_info) -> str:
        """``Type: message`` of the exception, plus where its traceback went."""
        kind, error = exc_info[0], exc_info[1]
        if kind is None:  # exc_info=True outside an exception (Luigi's RPC retry warnings): nothing to show
            return ""
        message = str(error).strip().splitlines()
        text = f"{kind.__name__}: {message[0] if message else ''}".rstrip(": ")
        log_file = os.environ.get("DEEPSPEECH_LOG_FILE")
        return text + (f" (traceback in {log_file})" if log_file else "")

    def formatStack(self, stack_info: str) -> str:
        """Stacks go to the log file only."""
        return ""
