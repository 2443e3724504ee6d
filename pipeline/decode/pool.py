"""Decoding many utterances in ``decoder.workers`` processes, each building its decoder once.

Each worker process builds the decoder a ``DecoderSpec`` names (``decoder.type``:
beam search with KenLM, greedy, or a user's module), so its LM and lexicon trie
are loaded once per process and serve every utterance and every (alpha, beta)
weighting it is given (tuning re-weights the same decoder instead of reloading
the LM per trial). Results
come back in submission order, so they equal a sequential decode. Work in
flight is bounded, so logits waiting to be decoded never pile up in memory.

This module imports no TensorFlow: worker processes are spawned (forking a
process that runs TensorFlow is unsafe) and import only the decoder.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np
from threadpoolctl import threadpool_limits

from native_client.decoders import Decoder, DecoderSpec, build_decoder, decoder_class

# Weights: (lm_alpha, lm_beta), or None for the settings the decoder was built with.
Weights = tuple[float, float] | None

_worker_decoder: dict = {}  # in a worker process only: the decoder it built, and its re-weighted copies


def _start_worker(spec: DecoderSpec) -> None:
    threadpool_limits(1)
    try:
        _worker_decoder[None] = build_decoder(spec)
    except Exception as error:  # raised again by each task: the caller sees it, not a broken pool
        _worker_decoder["error"] = error


def _decoder_for(base: Decoder, cache: dict, weights: Weights) -> Decoder:
    if weights not in cache:
        if len(cache) > 8:  # keep the base and a few weightings
            for key in [k for k in cache if k is not None][:4]:
                del cache[key]
        cache[weights] = base.reweighted(*weights)
    return cache[weights]


def _decode_in_worker(chunk: list[np.ndarray], weights: Weights) -> list[str]:
    if "error" in _worker_decoder:
        raise _worker_decoder["error"]
    decoder = _decoder_for(_worker_decoder[None], _worker_decoder, weights)
    return [decoder.decode(logits) for logits in chunk]


class DecodePool:
    """Decodes logits with the decoder ``spec`` describes, one per worker process (in this process when
    ``workers`` is 1; 0 means one per core). The spec is all a worker receives: it finds the decoder by
    ``spec.type`` and builds it, so any ``Decoder`` module, a user's included, works here."""

    def __init__(self, spec: DecoderSpec, workers: int = 0, chunk: int = 8):
        self.workers = workers or os.cpu_count() or 1
        self.chunk = chunk
        self.spec = spec
        decoder_class(spec.type)  # an unknown type fails here, by name, before any process starts
        if self.workers == 1:
            self._local = build_decoder(spec)
            self._local_cache: dict = {None: self._local}
            self._pool = None
        else:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(spec,),
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
