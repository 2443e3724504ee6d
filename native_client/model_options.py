"""The model and decoder options that ``deepspeech-transcribe`` and ``deepspeech-serve`` share (``--model``,
``--backend``, ``--threads``, ``--scorer``, ``--vocabulary``, ``--no-scorer``, ``--beam_width``,
``--lm_alpha``, ``--lm_beta``, ``--allow-plugin``, and the client's ``--hot_words``): one check of their
values and one loader, so that the server refuses what the client refuses, in the same words.
"""

from __future__ import annotations

import sys

from native_client.metadata import TRANSDUCER_NUMBERS
from native_client.ranges import DECODER_SETTINGS, Range, value_problem

# The widest modified beam search (each frame joins every hypothesis): what an export's metadata may say.
MAX_TRANSDUCER_BEAM = TRANSDUCER_NUMBERS["beam"][1]

# The options checked against the config's ranges (native_client.ranges): what a config refuses, the
# client and the server refuse too.
RANGES = (
    ("beam_width", DECODER_SETTINGS["beam_width"]),
    ("lm_alpha", DECODER_SETTINGS["lm_alpha"]),
    ("lm_beta", DECODER_SETTINGS["lm_beta"]),
    ("threads", Range(int, 1)),
)


def option_problem(args) -> str | None:
    """What is wrong with the model options of ``args`` (an ``argparse.Namespace``), as one line without
    the ``error: `` prefix, or None. Checked before anything is loaded."""
    if args.scorer and args.no_scorer:
        return "--scorer and --no-scorer contradict each other"
    for option, expected in RANGES:
        value = getattr(args, option)
        if value is not None and (problem := value_problem(value, expected)):
            return f"--{option}: {problem}"
    if getattr(args, "hot_words", None) and args.no_scorer:
        return "--hot_words boost words through the language model; --no-scorer has none"
    if args.vocabulary and not args.scorer:
        return "--vocabulary gives the words of a --scorer; name the KenLM binary with --scorer"
    return None


def open_model_for(args, model_location):
    """The model of ``args.model`` with the decoder the options ask for (the export's own decoder unless
    ``--scorer``/``--no-scorer``/``--beam_width``/... say otherwise); ``model_location(model, backend)``
    gives the export directory and backend (``native_client.__main__.model_location``, passed in: this
    module is below the client's entry point). The model's ``decoder_spec`` is the spec its decoder was
    built from (None: greedy), so another process can build the same (the server's decoding processes).
    A transducer export decodes with its modified beam search (``--beam_width`` hypotheses, the export's
    beam by default; greedy with ``--no-scorer``); the language model's options are ignored, which one
    warning line on stderr says.
    Raises ``ExportError``, ``ValueError`` (a plug-in refused,
    a bad scorer) or ``FileNotFoundError``, each one line."""
    from native_client.export_decoder import decoder_from_spec, decoder_spec_for_export
    from native_client.model import open_model
    from native_client.transducer_decoder import TransducerDecoder

    overrides = {"beam_width": args.beam_width, "lm_alpha": args.lm_alpha, "lm_beta": args.lm_beta}
    if getattr(args, "hot_words", None) is not None:
        overrides["hot_words"] = args.hot_words
    specs = []

    def factory(metadata):
        if metadata.transducer is not None:
            given = {
                "--scorer": args.scorer,
                "--hot_words": getattr(args, "hot_words", None),
                "--lm_alpha": args.lm_alpha,
                "--lm_beta": args.lm_beta,
            }
            ignored = [option for option, value in given.items() if value is not None and value is not False]
            if ignored:  # said once, where the model is opened: its search ignores them
                print(
                    f"warning: {', '.join(ignored)}: ignored: this export is a transducer, whose search "
                    f"reads no language model (shallow fusion is not built)",
                    file=sys.stderr,
                    flush=True,
                )
            if args.beam_width is not None and args.beam_width > MAX_TRANSDUCER_BEAM:
                raise ValueError(
                    f"--beam_width: a transducer's beam search keeps at most {MAX_TRANSDUCER_BEAM} "
                    f"hypotheses, got {args.beam_width}"
                )
            return None
        spec = decoder_spec_for_export(metadata, args.scorer, overrides, args.vocabulary)
        if spec is None:
            return None
        specs.append(spec)
        return decoder_from_spec(spec, metadata, args.allow_plugin)

    directory, backend = model_location(args.model, args.backend)
    model = open_model(
        directory,
        backend=backend,
        threads=args.threads,
        decoder_factory=None if args.no_scorer else factory,
        plugins=tuple(args.allow_plugin),
    )
    model.decoder_spec = specs[-1] if specs else None
    if model.beam_search is not None and args.beam_width and not args.no_scorer:  # a transducer's beam
        search = model.beam_search
        model.decoder = TransducerDecoder(search.parts, search.alphabet, args.beam_width, search.max_symbols)
    return model
