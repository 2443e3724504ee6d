"""The effect of feature augmentation: the sample config trained with and without it (same epochs),
each evaluated on the sample test split and on clips spoken by voices the sample never uses
(``data/unseen``, made by ``data/generate_unseen_voices.py``). Greedy and beam + LM WER/CER.

    python bench/augment.py [--config configs/sample.yaml] [--work /tmp/augment-bench]

Prints a Markdown table; the last line is one JSON object {name: {split: {wer, cer, wer_lm, cer_lm}}}.
Trains three times (the speed copies triple the epoch): about 25 minutes on 2 cores. Run it alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC_AUGMENT = {
    "freq_masks": 2,
    "freq_mask_max": 3,
    "time_masks": 2,
    "time_mask_max": 20,
    "time_mask_fraction": 0.1,
}
RUNS = {
    "no augmentation": {"speed_factors": []},
    "SpecAugment masks": {**SPEC_AUGMENT, "speed_factors": []},
    "speed copies 0.9 and 1.1": {"speed_factors": [0.9, 1.1]},
}


def _evaluate(config, out_dir: Path) -> dict:
    from pipeline.layout import Layout
    from pipeline.stages.evaluate import evaluate_stage
    from pipeline.stages.features import features_stage

    layout = Layout(config)
    features_stage(layout, "test")
    report = evaluate_stage(layout, out_dir=out_dir, beam=True)
    return {"wer": report.wer, "cer": report.cer, "wer_lm": report.wer_lm, "cer_lm": report.cer_lm}


def run(name: str, augment: dict, config_path: str, work: Path) -> dict:
    """Train ``config_path`` with ``augment`` in ``work``; its figures on the sample and unseen test sets."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.stages.features import features_stage
    from pipeline.stages.language_model import language_model_stage
    from pipeline.stages.train import train_stage

    overrides = {"paths": {"work_dir": str(work)}, "augment": augment}
    config = load_config(config_path, overrides)
    layout = Layout(config)
    for split in ("train", "dev"):
        features_stage(layout, split)
    train_stage(layout)
    language_model_stage(layout)
    unseen = load_config(
        config_path, {**overrides, "data": {"test_files": [str(ROOT / "data" / "unseen" / "unseen.csv")]}}
    )
    slug = name.replace(" ", "-")
    return {
        "sample test": _evaluate(config, work / "bench" / slug / "sample"),
        "unseen voices": _evaluate(unseen, work / "bench" / slug / "unseen"),
    }


def main(argv=None) -> int:
    """Train and evaluate every run; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "sample.yaml"))
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="augment-bench-"))
    figures = {name: run(name, augment, args.config, work) for name, augment in RUNS.items()}
    print("| training | test set | greedy WER | greedy CER | beam + LM WER | beam + LM CER |")
    print("|---|---|---|---|---|---|")
    for name, sets in figures.items():
        for split, f in sets.items():
            print(
                f"| {name} | {split} | {f['wer']:.3f} | {f['cer']:.3f} "
                f"| {f['wer_lm']:.3f} | {f['cer_lm']:.3f} |"
            )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    sys.exit(main())
