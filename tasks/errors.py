"""The error a task raises itself, apart from the stages' own, so that every task module can name it."""

from __future__ import annotations


class StageError(RuntimeError):
    """What ``complete()`` found wrong (a damaged output, a bad config); the message names the file or
    key and the remedy."""
