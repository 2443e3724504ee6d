"""Fine-tuning a real Coqui STT model: the armspeech 0.1.4 Armenian model on synthetic Armenian speech.

Builds a corpus with espeak-ng (``data/generate_armenian.py``: sentences split between train,
dev and test, each spoken in several voice variants and speeds), then, through the DAG
(``deepspeech-train Evaluate``: Features, Train, LanguageModel, Evaluate), trains the
DeepSpeech family at the model's geometry (n_hidden 2048, 26 DeepSpeech MFCCs, 9 frames of
context) twice for the same steps: warm-started from the ``.tflite`` (``training.init_from``, the
model's own alphabet so every layer loads) and from scratch. Reports the test CER and WER of the
model before fine-tuning (the ``.tflite`` through the client), after, and from scratch; greedy
and with beam search over the LanguageModel stage's word LM of the training sentences.

    make fetch-models
    python bench/finetune.py [--work DIR] [--train-utterances 160] [--epochs 2]

Prints the CPU, a Markdown table, the wall time; the last line is one JSON object
{"before": {...}, "fine_tuned": {...}, "from_scratch": {...}, "steps": N, "seconds": S}.
n_hidden 2048 trains at about 2 CPU-seconds per audio second at 50 frames per second: the
defaults (160 utterances, 2 epochs, 20 steps per run) take about half an hour on 2 free cores.
Run it alone (``uptime`` load below 1.5).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cpu_line() -> str:
    """The CPU model, its L3 and the load: every figure here depends on them."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    fields = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in lscpu if ":" in line}
    return (
        f"CPU: {fields.get('Model name', '?')}, {os.cpu_count()} cores, L3 {fields.get('L3 cache', '?')}; "
        f"load {os.getloadavg()[0]:.2f}"
    )


def write_config(path: Path, corpus: Path, work: Path, init_from: Path | None, args) -> Path:
    """A config of the DeepSpeech geometry on ``corpus``; ``init_from`` warm-starts it."""
    init = f"init_from: {init_from}" if init_from else ""
    path.write_text(
        textwrap.dedent(f"""
        paths: {{work_dir: {work}, alphabet: {corpus / "alphabet.txt"}}}
        data:
          train_files: [{corpus / "train.csv"}]
          dev_files: [{corpus / "dev.csv"}]
          test_files: [{corpus / "test.csv"}]
          limit_train: {args.train_utterances}
          limit_dev: {args.dev_utterances}
          limit_test: {args.test_utterances}
        features: {{type: deepspeech}}
        model: {{n_hidden: 2048, n_context: 9, dropout_rate: 0.0}}
        training:
          epochs: {args.epochs}
          batch_size: {args.batch_size}
          dev_batch_size: 16
          learning_rate: {args.learning_rate}
          checkpoint_secs: 3600
          report_count: 3
          {init}
        early_stop: {{rule: "off"}}
        augment: {{speed_factors: []}}
        decoder: {{lexicon: false, char_lm_order: 6, beam_width: 128}}
    """),
        encoding="utf-8",
    )
    return path


def run_dag(config: Path) -> float:
    """``deepspeech-train Evaluate`` on ``config`` (the whole DAG it needs); returns its wall seconds."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tasks.cli", "Evaluate", "--config", str(config), "--local-scheduler"],
        check=True,
    )
    return time.perf_counter() - started


def dag_figures(config_path: Path) -> dict:
    """Test WER/CER (greedy and beam + LM) of the Evaluate stage, and the Train run's steps."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.reports import TrainReport, read_report

    layout = Layout(load_config(config_path))
    evaluation = json.loads(Layout.evaluation_report(layout.evaluate_dir).read_text(encoding="utf-8"))
    train = read_report(layout.train_run.report, TrainReport)
    return {
        "wer": evaluation["wer"],
        "cer": evaluation["cer"],
        "wer_lm": evaluation["wer_lm"],
        "cer_lm": evaluation["cer_lm"],
        "steps": train.global_step,
    }


def before_figures(model_path: Path, config_path: Path) -> dict:
    """The ``.tflite`` itself on the test split through the client: greedy, and beam search with the same
    LM and settings the Evaluate stage used."""
    import soundfile

    from native_client import Model
    from native_client.decoders import build_decoder
    from pipeline.config_loader import load_config
    from pipeline.decode.settings import decoder_settings, decoder_spec
    from pipeline.evaluation.metrics import corpus_rates, score_sample
    from pipeline.layout import Layout

    config = load_config(config_path)
    model = Model(model_path)
    layout = Layout(config)
    settings = decoder_settings(config, layout.tune_report)
    beam = build_decoder(decoder_spec(config, layout.lm, model.metadata.alphabet, settings))
    greedy, with_lm = [], []
    test = Path(config.data.test_files[0])
    with open(test, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
        for row in rows[: config.data.limit_test or None]:
            logits = model.logits(soundfile.read(test.parent / row["wav_filename"], dtype="int16")[0])
            greedy.append(
                score_sample(row["wav_filename"], row["transcript"], model.greedy.decode(logits), 0.0)
            )
            with_lm.append(score_sample(row["wav_filename"], row["transcript"], beam.decode(logits), 0.0))
    rates, lm_rates = corpus_rates(greedy), corpus_rates(with_lm)
    return {
        "wer": rates["wer"],
        "cer": rates["cer"],
        "wer_lm": lm_rates["wer"],
        "cer_lm": lm_rates["cer"],
        "steps": 0,
    }


def main(argv=None) -> int:
    """Build the corpus, run both trainings through the DAG, print the figures."""
    from data.fetch_models import missing_message, model_path
    from data.generate_armenian import generate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="default: a new temporary directory")
    parser.add_argument(
        "--model", type=Path, default=None, help="default: the armspeech model of make fetch-models"
    )
    parser.add_argument(
        "--corpus", type=Path, default=None, help="an existing corpus (default: made in --work)"
    )
    parser.add_argument("--takes", type=int, default=3, help="voices per sentence in the corpus")
    parser.add_argument("--train-utterances", type=int, default=160)
    parser.add_argument("--dev-utterances", type=int, default=48)
    parser.add_argument("--test-utterances", type=int, default=0, help="0: the whole test split")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    args = parser.parse_args(argv)
    model = args.model or model_path("armspeech")
    if not model.is_file():
        print(missing_message("armspeech"), file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="finetune-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(cpu_line(), flush=True)
    started = time.perf_counter()
    corpus = args.corpus or work / "corpus"
    if not (corpus / "test.csv").is_file():
        counts = generate(corpus, args.takes, 60, 2024)
        print(f"corpus: {counts} utterances in {corpus}", flush=True)
    configs = {
        "fine_tuned": write_config(work / "fine_tuned.yaml", corpus, work / "fine_tuned", model, args),
        "from_scratch": write_config(work / "from_scratch.yaml", corpus, work / "from_scratch", None, args),
    }
    seconds = {name: run_dag(path) for name, path in configs.items()}
    figures = {"before": before_figures(model, configs["fine_tuned"])}
    figures.update({name: dag_figures(path) for name, path in configs.items()})
    total = time.perf_counter() - started
    print("| model | steps | test CER | test WER | CER beam + LM | WER beam + LM | DAG wall time |")
    print("|---|---|---|---|---|---|---|")
    for name, f in figures.items():
        wall = f"{seconds[name] / 60:.1f} min" if name in seconds else "-"
        label = name.replace("_", " ")
        print(
            f"| {label} | {f['steps']} | {f['cer']:.3f} | {f['wer']:.3f} | {f['cer_lm']:.3f} "
            f"| {f['wer_lm']:.3f} | {wall} |"
        )
    print(f"total wall time {total / 60:.1f} min; {cpu_line()}")
    print(json.dumps({**figures, "steps": figures["fine_tuned"]["steps"], "seconds": round(total, 1)}))
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    sys.exit(main())
