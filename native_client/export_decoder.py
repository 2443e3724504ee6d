"""The decoder an export describes: its metadata's ``decoder`` entry (type, settings, LM files) as a
``DecoderSpec``, so the client decodes as Evaluate did; the CLI's options override parts of it. Hot
words are normalised with the export's text settings (``data.text``), as training's transcripts were."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from native_client.arpa import arpa_unigrams, is_arpa
from native_client.decoders import DEFAULT_TYPE, Decoder, DecoderSpec, decoder_class
from native_client.metadata import METADATA_NAME, ExportMetadata, verify_manifest
from native_client.scorer_package import is_scorer_package, read_scorer_package
from native_client.text import TranscriptRejected, normalise_transcript


def normalised_hot_words(hot_words: dict[str, float], metadata: ExportMetadata) -> dict[str, float]:
    """``{word: boost}`` with each word normalised as training's text was (the export's ``text``
    settings; an export before they were recorded: its alphabet's own rule), so ``Café`` or an NFD
    ``café`` boosts the ``café`` the model spells. ValueError names a word that normalises to nothing."""
    normalised = {}
    for word, boost in hot_words.items():
        try:
            text = (
                normalise_transcript(word, metadata.text)
                if metadata.text
                else metadata.alphabet.normalise(word)
            )
        except TranscriptRejected:
            text = ""
        if not text:
            raise ValueError(f"hot word {word!r}: nothing is left of it after normalisation")
        normalised[text] = boost
    return normalised


def decoder_spec_for_export(
    metadata: ExportMetadata,
    scorer: str | Path | None = None,
    overrides: dict | None = None,
    vocabulary_file: str | Path | None = None,
) -> DecoderSpec | None:
    """The spec of the export's decoder, with another LM (``scorer``) and ``overrides`` of its settings
    (``beam_width``, ``lm_alpha``, ``lm_beta``, ``hot_words``; None values are ignored). None when the
    export has no LM and no scorer is given (the client then decodes greedily).

    ``type`` is the entry's (exports written before decoders had types: ``beam``). The LM is the word
    LM with a lexicon and the character LM without; the export's files are checked against its
    manifest. A scorer brings its vocabulary: an ARPA file its unigrams, a KenLM binary the words of
    ``vocabulary_file`` (white-space separated), a DeepSpeech/Coqui ``.scorer`` package its own words
    and default weights (``native_client.scorer_package``). A transducer export: None (its own searches,
    ``open_model``), and a ``scorer`` is a ValueError."""
    entry = dict(metadata.decoder or {})
    if metadata.transducer is not None:  # its own searches (open_model), no LM: metadata.json has none
        if scorer:
            raise ValueError(
                f"{scorer}: this export is a transducer, whose search reads no language model (shallow "
                f"fusion is not built)"
            )
        return None
    if scorer:
        _check_scorer(Path(scorer))
    settings = {
        key: value for key, value in entry.items() if key not in ("type", "lm", "char_lm", "vocabulary")
    }
    package = read_scorer_package(scorer, metadata.alphabet) if scorer and is_scorer_package(scorer) else None
    if package is not None:  # a DeepSpeech .scorer: its words, and its defaults unless overridden
        settings.update(lm_alpha=package.lm_alpha, lm_beta=package.beta, lexicon=True)
    settings.update({key: value for key, value in (overrides or {}).items() if value is not None})
    if settings.get("hot_words"):
        settings["hot_words"] = normalised_hot_words(settings["hot_words"], metadata)
    lexicon = bool(settings.get("lexicon", True))
    key = "lm" if lexicon else "char_lm"
    lm = Path(scorer) if scorer else (metadata.directory / entry[key] if entry.get(key) else None)
    if lm is None:
        return None
    if not scorer:
        verify_manifest(
            metadata.directory,
            [entry[key]] + ([entry["vocabulary"]] if lexicon and entry.get("vocabulary") else []),
        )
    if not lm.is_file():
        raise FileNotFoundError(f"{lm}: language model file not found")
    vocabulary: str | tuple[str, ...] | None = None
    if lexicon:
        vocab_file = metadata.directory / entry["vocabulary"] if entry.get("vocabulary") else None
        if vocabulary_file:
            vocabulary = _read_words(vocabulary_file)
        elif package is not None:
            vocabulary = tuple(package.words)
        elif scorer and is_arpa(lm):
            vocabulary = tuple(arpa_unigrams(lm))
        elif vocab_file is not None and vocab_file.is_file():
            vocabulary = str(vocab_file)
        else:
            raise FileNotFoundError(
                f"{vocab_file or metadata.directory / METADATA_NAME}: vocabulary needed for "
                f"lexicon decoding is missing"
                + ("" if vocab_file else " (no decoder.vocabulary entry; --vocabulary names a word list)")
            )
    return DecoderSpec(
        type=entry.get("type") or DEFAULT_TYPE,
        labels=tuple(getattr(metadata.alphabet, "labels", ())),
        output=metadata.output,
        lm=str(lm),
        vocabulary=vocabulary,
        settings=settings,
    )


def _check_scorer(path: Path) -> None:
    """FileNotFoundError or ValueError naming ``path`` unless it is a file that begins as a language model
    does (ARPA text, a KenLM binary, a .scorer package, which is one): KenLM would report anything else
    in a message that does not name the file, or not even decode as text."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise FileNotFoundError(f"{path}: language model file {what}")
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
    except OSError as error:
        raise ValueError(f"{path}: cannot read the language model: {error.strerror or error}") from None
    if not (head.lstrip().startswith(b"\\data\\") or head.startswith(b"mmap lm ")):
        raise ValueError(
            f"{path}: not a language model (an ARPA file, a KenLM binary or a DeepSpeech/Coqui .scorer)"
        )


def _read_words(path: str | Path) -> tuple[str, ...]:
    """The white-space separated words of a vocabulary file; ValueError naming it when it cannot be read."""
    try:
        return tuple(Path(path).read_text(encoding="utf-8").split())
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ValueError(f"--vocabulary {path}: cannot read it as UTF-8 words ({reason})") from None


def decoder_for_export(
    metadata: ExportMetadata,
    scorer: str | Path | None = None,
    overrides: dict | None = None,
    allowed: Iterable[str] = (),
    vocabulary_file: str | Path | None = None,
) -> Decoder | None:
    """The decoder ``decoder_spec_for_export`` describes, or None (greedy) when the export has no LM.

    An export never chooses code to import by itself: a decoder type that is a dotted module (a user's
    own) is loaded only when it is in ``allowed`` (the client's ``--allow-plugin``; Transcribe allows the
    config's own ``decoder.type``). A refused or unknown type is a PluginError naming the metadata file."""
    spec = decoder_spec_for_export(metadata, scorer, overrides, vocabulary_file)
    return None if spec is None else decoder_from_spec(spec, metadata, allowed)


def decoder_from_spec(spec: DecoderSpec, metadata: ExportMetadata, allowed: Iterable[str] = ()) -> Decoder:
    """The decoder of ``spec`` (from ``decoder_spec_for_export``), its type checked as
    ``decoder_for_export`` says; a refused or unknown type is a PluginError naming the metadata file."""
    what = f"{metadata.directory / METADATA_NAME}: decoder.type"
    return decoder_class(spec.type, what, allowed=tuple(allowed)).from_spec(spec)
