"""Run inside pyctcdecode's own venv by bench/decoder.py: decode saved log-probs, print timings and
texts as JSON.

python pyctcdecode_runner.py <inputs.npz> <settings.json>
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from pyctcdecode import build_ctcdecoder


def main(npz_path: str, settings_path: str) -> None:
    """Decode every utterance at every beam width; print {beam: {"seconds", "texts"}}."""
    settings = json.loads(open(settings_path).read())
    data = np.load(npz_path)
    utterances = [data[f"u{i}"] for i in range(int(data["count"]))]
    decoder = build_ctcdecoder(
        settings["labels"],
        kenlm_model_path=settings["lm"],
        unigrams=settings["unigrams"],
        alpha=settings["alpha"],
        beta=settings["beta"],
    )
    decoder.decode(utterances[0], beam_width=4)  # load everything before timing
    out = {}
    for beam in settings["beams"]:
        started = time.perf_counter()
        texts = [decoder.decode(u, beam_width=beam) for u in utterances]
        out[str(beam)] = {"seconds": time.perf_counter() - started, "texts": texts}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
