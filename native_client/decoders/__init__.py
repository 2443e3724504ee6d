"""Decoders: CTC logits to text, behind one small interface, chosen by name (``decoder.type``).

Built in, one module each: ``greedy`` (best path, no language model) and ``beam``
(CTC beam search with a KenLM language model through flashlight-text, lexicon and
lexicon-free). A decoder of your own is one module that defines ``DECODER``, a
subclass of ``Decoder``; name it by its dotted path (``decoder.type:
mylab.decoders.wfst``) and Evaluate, TuneDecoder, the export and the client use it.

Every caller builds its decoder from a ``DecoderSpec``, a plain picklable record
(type, alphabet labels, LM path, vocabulary, settings): ``DecodePool`` sends it to
spawned worker processes, which build their own decoder from it; the client builds
the spec from the export's metadata, so it decodes as Evaluate did.

What callers rely on (and nothing more):

- ``name``: a short label for reports and transcripts (``greedy``, ``beam+lm``).
- ``decode(logits) -> str``: logits ``[time, n_classes]`` as the model gives them
  (float32, not normalised: apply ``log_softmax`` if you need log probabilities;
  class ``i < spec.alphabet().size`` is a label, the last class is the CTC blank; decode labels
  with ``spec.alphabet().decode``, which handles byte labels too).
  Zero frames must give ``""`` (a stream may be asked before any audio). A stream
  calls it again on longer logits for intermediate transcripts, so it must not
  keep state between calls.
- ``candidates(logits, count, seconds_per_frame) -> list[Candidate]``: at least one
  and at most ``count`` distinct transcripts, best first, the first one's text being
  ``decode``'s; each with a confidence (higher is surer) and word timings (see
  ``native_client.transcripts.word_timings``; frame ``i`` starts at
  ``i * seconds_per_frame``).
- ``reweighted(lm_alpha, lm_beta) -> Decoder``: the same decoder with other LM
  weights, cheaply (TuneDecoder asks for dozens of pairs; the LM is not reloaded).
  A decoder without LM weights answers with itself (the default).
- ``from_spec(spec)`` (a class method): build the decoder. Settings it does not
  know are ignored; settings it cannot honour (say hot words without an LM) raise
  ``ValueError`` with a one-line message.

A decoder is used by one thread at a time and is never pickled (each process builds
its own from the spec). A transducer's decoders (``native_client.transducer_decoder``)
subclass ``Decoder`` too, over its projected encoder frames instead of CTC logits;
they call the export's own networks, so they are built from the export, not a spec,
and may be shared by threads (their calls to the networks are serialised).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from native_client.alphabet import Labels, make_alphabet
from native_client.plugins import PluginError, find_plugin
from native_client.transcripts import Candidate

DEFAULT_TYPE = "beam"


@dataclass(frozen=True)
class DecoderSpec:
    """Everything needed to build a decoder, as plain picklable values.

    ``type``: a built-in decoder module's name or the dotted path of one of yours.
    ``labels``: the alphabet's labels (the blank is the class after them); none with ``output`` bytes.
    ``output``: ``characters`` (``labels`` are the alphabet) or ``bytes`` (UTF-8 byte labels,
    ``native_client.alphabet.ByteAlphabet``).
    ``lm``: the language model file (ARPA or KenLM binary), or None.
    ``vocabulary``: the words a lexicon decoder may emit: a path to a file of
    whitespace-separated words, or the words themselves; None without a lexicon.
    ``settings``: the decoder's settings (``decoder`` config keys such as
    ``beam_width``, ``lm_alpha``, ``lm_beta``, ``lexicon``; ``hot_words``
    ``{word: boost}`` from the client).
    """

    type: str = DEFAULT_TYPE
    labels: tuple[str, ...] = ()
    lm: str | None = None
    vocabulary: str | tuple[str, ...] | None = None
    settings: Mapping = field(default_factory=dict)
    output: str = "characters"

    def alphabet(self) -> Labels:
        """The model's labels: the ``Alphabet`` of ``labels``, or the ``ByteAlphabet``."""
        return make_alphabet(self.output, self.labels)

    def words(self) -> list[str] | None:
        """The vocabulary's words (read from the file when ``vocabulary`` is a path), or None."""
        if self.vocabulary is None:
            return None
        if isinstance(self.vocabulary, (str, Path)):
            return Path(self.vocabulary).read_text(encoding="utf-8").split()
        return list(self.vocabulary)


class Decoder(abc.ABC):
    """CTC logits to text. See this package's docstring for what each method must guarantee.

    An abstract class rather than a ``typing.Protocol``: it carries the one default
    (``reweighted`` answering with itself), and the lookup can refuse, by name and
    before any work, a ``DECODER`` that is not a decoder, instead of a worker
    process failing mid-evaluation on a missing method.
    """

    name: str = ""  # every decoder class sets it

    @classmethod
    @abc.abstractmethod
    def from_spec(cls, spec: DecoderSpec) -> Decoder:
        """The decoder ``spec`` describes."""

    @abc.abstractmethod
    def decode(self, logits: np.ndarray) -> str:
        """The best transcript of ``logits`` ``[time, n_classes]``."""

    @abc.abstractmethod
    def candidates(self, logits: np.ndarray, count: int, seconds_per_frame: float) -> list[Candidate]:
        """At least one and at most ``count`` distinct transcripts of ``logits``, best first."""

    def reweighted(self, lm_alpha: float, lm_beta: float) -> Decoder:
        """This decoder with other LM weights; one without LM weights is unchanged by them."""
        return self


def decoder_class(
    type_name: str, what: str = "decoder.type", allowed: Iterable[str] | None = None
) -> type[Decoder]:
    """The ``Decoder`` subclass named ``type_name`` (a module of this package, or a dotted module path
    whose ``DECODER`` it is). Raises PluginError (a ValueError) naming ``what`` when there is none.

    ``allowed``: when the name comes from a file someone else made (an export's metadata), the dotted
    names that may be imported (the client's ``--allow-plugin``); built-in names need none."""
    found = find_plugin(__name__, type_name, "DECODER", what, allowed)
    if not (isinstance(found, type) and issubclass(found, Decoder)):
        raise PluginError(
            f"{what}: {type_name!r}: DECODER is {found!r}, expected a subclass of "
            f"native_client.decoders.Decoder"
        )
    if not (isinstance(found.name, str) and found.name):
        raise PluginError(f"{what}: {type_name!r}: {found.__name__} has no name (a class attribute)")
    return found


def build_decoder(spec: DecoderSpec) -> Decoder:
    """The decoder ``spec`` describes, found by ``spec.type``."""
    return decoder_class(spec.type).from_spec(spec)
