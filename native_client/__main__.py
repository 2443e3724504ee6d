"""Command line: ``python -m native_client --model <export dir> --audio <wav> [--audio ...] [--json]``."""
from __future__ import annotations

import argparse
import json
import sys

from native_client.audio import AudioError
from native_client.metadata import METADATA_NAME, ExportError
from native_client.beam import beam_decoder_for_export
from native_client.model import open_model
from native_client.runtime import BACKENDS


def parse_args(argv=None) -> argparse.Namespace:
    """The CLI's arguments."""
    parser = argparse.ArgumentParser(prog="python -m native_client", description="Transcribe audio files with an exported model.")
    parser.add_argument("--model", required=True, help=f"export directory (holds {METADATA_NAME}, or numbered versions of it)")
    parser.add_argument("--audio", required=True, action="append", help="audio file (WAV, FLAC, ...); repeat for several")
    parser.add_argument("--json", action="store_true", help="one JSON object per file: audio, text, duration_s, processing_s, rtf")
    parser.add_argument("--backend", choices=BACKENDS, default="tflite", help="model runtime (default: tflite)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for the model (default: 1)")
    parser.add_argument("--scorer", help="language model (ARPA or KenLM binary) instead of the export's own")
    parser.add_argument("--no-scorer", action="store_true", help="greedy decoding, no language model")
    parser.add_argument("--beam-width", type=int, help="beam width (default: the export's decoder settings)")
    parser.add_argument("--lm-alpha", type=float, help="LM weight (default: the export's, tuned when it was tuned)")
    parser.add_argument("--lm-beta", type=float, help="word insertion score (default: the export's)")
    parser.add_argument("--resample", action="store_true",
                        help="resample audio whose rate differs from the model's (default: refuse such files)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Transcribe each ``--audio``; a file that fails is reported and the others still run. Exit 1 if any failed."""
    args = parse_args(argv)
    if args.scorer and args.no_scorer:
        print("error: --scorer and --no-scorer contradict each other", file=sys.stderr)
        return 2
    overrides = {"beam_width": args.beam_width, "lm_alpha": args.lm_alpha, "lm_beta": args.lm_beta}
    factory = None if args.no_scorer else (lambda metadata: beam_decoder_for_export(metadata, args.scorer, overrides))
    try:
        model = open_model(args.model, backend=args.backend, threads=args.threads, decoder_factory=factory)
    except (ExportError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failed = 0
    for path in args.audio:
        try:
            result = model.transcribe_file(path, convert_rate=args.resample)
        except AudioError as error:
            print(f"error: {error}", file=sys.stderr)
            failed += 1
            continue
        if args.json:
            print(json.dumps(result.to_dict()), flush=True)
        else:
            print(result.text if len(args.audio) == 1 else f"{path}: {result.text}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
