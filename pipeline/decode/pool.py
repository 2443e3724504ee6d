"""Beam search over many utterances in ``decoder.workers`` processes, each building its decoder once.

KenLM's model and the lexicon trie are loaded once per worker process and
serve every utterance and every (alpha, beta) weighting it is given (tuning
re-weights the same decoder instead of reloading the LM per trial). Results
come back in submission order, so they equal a sequential decode. Work in
flight is bounded, so logits waiting to be decoded never pile up in memory.

This module imports no TensorFlow: worker processes are spawned (forking a
process that runs TensorFlow is unsafe) and import only the decoder.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Optional

import numpy as np
from threadpoolctl import threadpool_limits

from native_client.alphabet import Alphabet
from native_client.beam import BeamDecoder, BeamSettings

# Weights: (lm_alpha, lm_beta), or None for the settings the decoder was built with.
Weights = Optional[tuple[float, float]]

_worker_decoder: dict = {}  # in a worker process only: the decoder it built, and its re-weighted copies


def _start_worker(
    labels: tuple[str, ...], lm: str, settings: dict, vocabulary: Sequence[str] | None
) -> None:
    threadpool_limits(1)
    _worker_decoder[None] = BeamDecoder(Alphabet(labels), lm, BeamSettings(**settings), vocabulary)


def _decoder_for(base: BeamDecoder, cache: dict, weights: Weights) -> BeamDecoder:
    if weights not in cache:
        if len(cache) > 8:  # keep the base and a few weightings
            for key in [k for k in cache if k is not None][:4]:
                del cache[key]
        cache[weights] = base.reweighted(*weights)
    return cache[weights]


def _decode_in_worker(chunk: list[np.ndarray], weights: Weights) -> list[str]:
    decoder = _decoder_for(_worker_decoder[None], _worker_decoder, weights)
    return [decoder.decode(logits) for logits in chunk]


class DecodePool:
    """Decodes logits with one beam decoder per worker process (in this process when ``workers`` is 1)."""

    def __init__(
        self,
        alphabet: Alphabet,
        lm_path: str | Path,
        settings: BeamSettings,
        vocabulary: Sequence[str] | None,
        workers: int = 0,
        chunk: int = 8,
    ):
        self.workers = workers or os.cpu_count() or 1
        self.chunk = chunk
        self.settings = settings
        if self.workers == 1:
            self._local = BeamDecoder(alphabet, lm_path, settings, vocabulary)
            self._local_cache: dict = {None: self._local}
            self._pool = None
        else:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(
                    tuple(alphabet.labels),
                    str(lm_path),
                    vars(settings).copy(),
                    list(vocabulary) if vocabulary is not None else None,
                ),
            )

    def decode(
        self,
        logits: Iterable[np.ndarray],
        weights: Weights = None,
        on_done: Callable[[int], None] = lambda count: None,
    ) -> list[str]:
        """Transcripts of every ``[time, classes]`` array in ``logits``, in order; ``on_done(count)`` is
        told how many are decoded as they come back.

        ``logits`` may be a generator (read from disk, or produced by a model):
        at most a few chunks per worker are in flight at once.
        """
        if self._pool is None:
            decoder = _decoder_for(self._local, self._local_cache, weights)
            texts = []
            for item in logits:
                texts.append(decoder.decode(item))
                on_done(len(texts))
            return texts
        texts: list[str] = []
        in_flight: deque[Future] = deque()
        chunk: list[np.ndarray] = []
        for item in logits:
            chunk.append(item)
            if len(chunk) == self.chunk:
                in_flight.append(self._pool.submit(_decode_in_worker, chunk, weights))
                chunk = []
                if len(in_flight) >= 4 * self.workers:
                    texts.extend(in_flight.popleft().result())
                    on_done(len(texts))
        if chunk:
            in_flight.append(self._pool.submit(_decode_in_worker, chunk, weights))
        while in_flight:
            texts.extend(in_flight.popleft().result())
            on_done(len(texts))
        return texts

    def close(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
