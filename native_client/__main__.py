"""Command line, compatible with DeepSpeech's client:

    deepspeech-transcribe --model <export dir | model.tflite | output_graph.pb | model.onnx>
        --audio a.wav [--audio ...]
        [--scorer lm.arpa | lm.binary --vocabulary words.txt | kenlm.scorer | --no-scorer] [--beam_width N]
        [--lm_alpha A] [--lm_beta B] [--hot_words word:boost,...] [--candidate_transcripts N] [--extended]
        [--json] [--no-resample] [--allow-plugin MODULE] [--vad] [--format text|json|srt|vtt] [--version]

(also ``python -m native_client``). Hyphen and underscore spellings of the options are both accepted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from native_client.audio import AudioError
from native_client.deepspeech_tflite import is_deepspeech_tflite
from native_client.long_audio import add_arguments as add_long_audio_arguments
from native_client.long_audio import render
from native_client.metadata import FORMAT_VERSION, METADATA_NAME, ExportError
from native_client.model_options import open_model_for, option_problem
from native_client.quiet import quiet_exit
from native_client.runtime import BACKENDS

BACKEND_OF_SUFFIX = {".tflite": "tflite", ".pb": "frozen_graph", ".onnx": "onnx"}


def _version() -> str:
    try:
        from importlib.metadata import version

        package = version("luigi-deepspeech")
    except Exception:  # not installed as a distribution (run from a checkout)
        package = "unknown"
    return f"deepspeech-transcribe {package} (export format {FORMAT_VERSION})"


def parse_args(argv=None) -> argparse.Namespace:
    """The CLI's arguments."""
    parser = argparse.ArgumentParser(
        prog="deepspeech-transcribe", description="Transcribe audio files with an exported model."
    )
    parser.add_argument(
        "--model",
        required=True,
        help=f"export directory (holds {METADATA_NAME}, or numbered versions of it), or one of its "
        f"model files (.tflite, .pb, saved_model/), or a DeepSpeech 0.7+/Coqui STT .tflite model",
    )
    parser.add_argument(
        "--audio", required=True, action="append", help="audio file (WAV, FLAC, ...); repeat for several"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per file: audio, text, duration_s, processing_s, rtf, transcripts "
        "(confidence and words with start_time and duration)",
    )
    parser.add_argument(
        "--extended",
        action="store_true",
        help="the best transcript, then a line per word: start and duration in seconds, confidence (as "
        "--json's), the word, tab-separated",
    )
    parser.add_argument(
        "--candidate_transcripts",
        "--candidate-transcripts",
        type=int,
        default=3,
        metavar="N",
        help="how many transcripts to report with --json (beam search; default 3)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        help="model runtime (default: from --model's file, else tflite)",
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for the model (default: 1)")
    parser.add_argument(
        "--scorer",
        help="language model instead of the export's own: ARPA, KenLM binary (with --vocabulary) or a "
        "DeepSpeech/Coqui .scorer package",
    )
    parser.add_argument(
        "--vocabulary",
        help="the words of a KenLM binary --scorer (white-space separated; an ARPA scorer lists its own)",
    )
    parser.add_argument(
        "--no-scorer", "--no_scorer", action="store_true", help="greedy decoding, no language model"
    )
    parser.add_argument(
        "--beam_width", "--beam-width", type=int, help="beam width (default: the export's decoder settings)"
    )
    parser.add_argument(
        "--lm_alpha",
        "--lm-alpha",
        type=float,
        help="LM weight (default: the export's, tuned when it was tuned)",
    )
    parser.add_argument(
        "--lm_beta", "--lm-beta", type=float, help="word insertion score (default: the export's)"
    )
    parser.add_argument(
        "--hot_words",
        "--hot-words",
        type=parse_hot_words,
        metavar="WORD:BOOST,...",
        help="boost words (or, with a negative boost, suppress them): each boost is added to the word's "
        "natural-log LM probability before lm_alpha, as DeepSpeech 0.9's --hot_words",
    )
    parser.add_argument(
        "--no-resample",
        "--no_resample",
        action="store_true",
        help="refuse audio at another sample rate (default: resample it, with a warning)",
    )
    parser.add_argument(
        "--resample", action="store_true", help=argparse.SUPPRESS
    )  # the default now; kept for old scripts
    parser.add_argument(
        "--allow-plugin",
        "--allow_plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="let the export load this module of one's own (a front end or decoder named by its dotted name "
        "in the export's metadata); repeat for several. Built-in ones need none",
    )
    add_long_audio_arguments(parser)
    parser.add_argument("--version", action="version", version=_version())
    return parser.parse_args(argv)


def parse_hot_words(text: str) -> dict[str, float]:
    """DeepSpeech's ``--hot_words`` value: comma-separated ``word:boost`` pairs -> ``{word: boost}``."""
    hot_words = {}
    for pair in text.split(","):
        word, colon, boost = pair.strip().rpartition(":")
        try:
            value = float(boost)
        except ValueError:
            value = math.nan
        if not colon or not word or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected word:boost pairs separated by commas, got {pair!r}")
        hot_words[word] = value
    return hot_words


def model_location(model: str, backend: str | None) -> tuple[Path, str]:
    """(export directory, backend) for ``--model``: a directory, or a model file inside an export; a
    DeepSpeech/Coqui ``.tflite`` (recognised by its metadata outputs) is returned as the file itself."""
    path = Path(model)
    if is_deepspeech_tflite(path):  # a DeepSpeech 0.7+/Coqui STT model: the file is the whole model
        if backend and backend != "tflite":
            raise ExportError(f"{model}: a DeepSpeech/Coqui .tflite model, but --backend {backend} was given")
        return path, "tflite"
    if path.is_file():
        if path.suffix not in BACKEND_OF_SUFFIX:
            raise ExportError(
                f"{path}: not a model file (expected an export directory, a .tflite, a .pb or a .onnx)"
            )
        implied = BACKEND_OF_SUFFIX[path.suffix]
    elif path.is_dir() and not (path / METADATA_NAME).is_file() and (path.parent / METADATA_NAME).is_file():
        implied, path = "saved_model", path  # <export>/saved_model
    elif not path.exists():
        raise ExportError(f"{path}: no such export directory or model file")
    else:
        return path, backend or "tflite"
    if backend and backend != implied:
        raise ExportError(f"{model}: a model of the {implied} backend, but --backend {backend} was given")
    return path.parent, implied


def format_result(result, json_output: bool = False, extended: bool = False, several: bool = False) -> str:
    """What the CLI prints for one transcript: the text (``path: text`` when several files are given);
    ``json_output``: the JSON record; ``extended`` (which wins over ``json_output``, as in DeepSpeech): the
    best candidate's text, then one line per word (``word_lines``)."""
    if json_output and not extended:
        return json.dumps(result.to_dict())
    best = result.candidates[0] if extended and result.candidates else None
    text = best.text if best is not None else result.text
    first = text if not several else f"{result.audio}: {text}"
    return "\n".join([first, *word_lines(best.words)]) if best is not None else first


def word_lines(words) -> list[str]:
    """``--extended``'s line per word, tab-separated: start time and duration in seconds, confidence
    (``transcripts.word_timings``: the same number as ``--json``'s and the server's; ``-`` when the
    decoder gives none), the word."""
    lines = []
    for w in words:
        confidence = "-" if w.confidence is None else f"{w.confidence:.4f}"
        lines.append(f"{w.start_time:.3f}\t{w.duration:.3f}\t{confidence}\t{w.word}")
    return lines


def main(argv=None) -> int:
    """Transcribe each ``--audio``; a file that fails is reported and the others still run.
    Exit 1 if any failed."""
    args = parse_args(argv)
    if problem := option_problem(args):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.candidate_transcripts < 1:
        print("error: --candidate_transcripts must be at least 1", file=sys.stderr)
        return 2
    try:
        model = open_model_for(args, model_location)
    except (ExportError, ValueError, FileNotFoundError) as error:  # PluginError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.hot_words and model.decoder is model.greedy:
        print(
            f"error: --hot_words needs a language model: {args.model} has none (give --scorer)",
            file=sys.stderr,
        )
        return 2
    failed = 0
    for path in args.audio:

        def warn(rate: int, path=path) -> None:
            print(
                f"warning: {path}: sample rate {rate} Hz, resampling to the model's {model.sample_rate} Hz "
                f"(accuracy may suffer; --no-resample refuses such files)",
                file=sys.stderr,
                flush=True,
            )

        try:
            if args.vad or args.format in ("srt", "vtt"):
                from native_client.long_audio import transcribe_segmented

                result = transcribe_segmented(model, path, not args.no_resample, warn)
            else:
                result = model.transcribe_file(
                    path,
                    convert_rate=not args.no_resample,
                    candidates=args.candidate_transcripts if args.json and not args.extended else 1,
                    on_resample=warn,
                )
        except AudioError as error:
            print(f"error: {error}", file=sys.stderr)
            failed += 1
            continue
        if args.format in ("srt", "vtt"):
            print(render(result, args.format), end="", flush=True)
            continue
        json_output = args.json or args.format == "json"
        print(format_result(result, json_output, args.extended, len(args.audio) > 1), flush=True)
    return 1 if failed else 0


def run() -> int:
    """The ``deepspeech-transcribe`` command: ``main`` with the runtime's exit chatter kept off stderr."""
    return quiet_exit(main())


if __name__ == "__main__":
    sys.exit(run())
