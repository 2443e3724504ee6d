"""Multi-task training on a low-resource task (issue 34): French, a few minutes of espeak-ng speech, trained
alone, with an English head sharing the encoder (the embedded sample corpus), and with an auxiliary head of
its own transcripts as phonemes (espeak-ng's IPA, ``targets: phonemes``); the French test CER of each after
the same number of training steps.

The French corpus is made here: sentences of a small French grammar (subjects, verbs, objects, complements;
dev and test sentences never in train), each spoken by one of several French espeak-ng voices at a random
rate and pitch (``data/generate_corpus.py``'s synthesis, 16 kHz FLAC). The runs share one work directory,
so French's features are computed once and read by all three (a task's stages hash as a single-task run's).

Same steps: the multi-task runs draw round_robin (every step one French batch and one batch of the other
task, one update); English is limited to ``--english-ratio`` times the French training utterances, so an
epoch of the English run is that many French epochs, and the French-alone and phoneme runs train that many
times more epochs. Every run keeps the checkpoint of its best dev CER (``training.best_by: cer``, of the
tasks' weighted mean for the multi-task runs: with the English head that mean includes English's), greedy
decoding, no LM: the figures are the acoustic model's.

    python bench/multitask.py            # the full run (the lead's: about 20 minutes on 2 cores)
    python bench/multitask.py --quick    # a smoke run: a few utterances, a tiny model, one step budget

First line: the CPU; last line: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample"

SUBJECTS = (
    "le chat", "la petite fille", "mon voisin", "notre professeur", "le boulanger", "ma sœur",
    "un vieux marin", "cette femme", "le médecin", "son frère", "la reine", "un enfant", "le facteur",
    "ta mère", "le garçon", "la musicienne",
)  # fmt: skip
VERBS = (
    "mange", "regarde", "prépare", "cherche", "trouve", "achète", "porte", "dessine", "ouvre", "ferme",
    "lave", "répare", "vend", "aime", "choisit", "attend",
)  # fmt: skip
OBJECTS = (
    "une pomme verte", "le journal", "la fenêtre", "un gâteau", "la voiture rouge", "les fleurs",
    "un livre ancien", "la porte", "le café chaud", "une lettre", "le vélo", "les clés", "un chapeau",
    "la soupe", "le tableau", "une chanson",
)  # fmt: skip
COMPLEMENTS = (
    "ce matin", "dans la cuisine", "près de la gare", "avec soin", "sous la pluie", "au marché",
    "tous les jours", "à la maison", "dans le jardin", "après le dîner", "en silence", "pour la fête",
)  # fmt: skip
VOICES = ("fr", "fr+m3", "fr+f2", "fr-be", "fr+f4", "fr-ch+m1")


def french_sentences(count: int, seed: int) -> list[str]:
    """``count`` distinct sentences of the grammar, in a seeded order."""
    rng = random.Random(seed)
    found: dict[str, None] = {}
    while len(found) < count:
        words = (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(COMPLEMENTS))
        found[" ".join(words)] = None
    return list(found)


def french_corpus(out: Path, counts: dict[str, int], seed: int) -> dict[str, Path]:
    """Speak the splits' sentences (``counts`` per split) into ``out``; returns the manifests by split."""
    sys.path.insert(0, str(ROOT))
    from data.generate_corpus import synthesise

    sentences = french_sentences(sum(counts.values()), seed)
    rng = random.Random(seed + 1)
    jobs, rows, start = [], {}, 0
    for split, count in counts.items():
        (out / split).mkdir(parents=True, exist_ok=True)
        rows[split] = []
        for index, text in enumerate(sentences[start : start + count]):
            audio = out / split / f"{index:05d}.flac"
            voice, rate, pitch = rng.choice(VOICES), rng.randint(140, 200), rng.randint(30, 70)
            jobs.append((text, str(audio), voice, rate, pitch, 100))
            rows[split].append((audio, text))
        start += count
    with Pool(os.cpu_count() or 1) as pool:
        seconds = sum(pool.map(synthesise, jobs))
    manifests = {}
    for split, items in rows.items():
        manifests[split] = out / f"{split}.csv"
        with open(manifests[split], "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["wav_filename", "wav_filesize", "transcript"])
            writer.writerows((audio.relative_to(out), audio.stat().st_size, text) for audio, text in items)
    print(f"French corpus: {counts}, {seconds / 60:.1f} minutes of speech", flush=True)
    return manifests


def base_config(folder: Path, quick: bool) -> Path:
    """What the three runs share: the work directory, features, model, training, greedy decoding."""
    path = folder / "base.yaml"
    path.write_text(
        textwrap.dedent(f"""
        paths: {{work_dir: {folder / "work"}, export_dir: {folder / "models"}}}
        data: {{max_reject_fraction: 0.2}}
        features: {{type: deepspeech, normalize: true}}
        model: {{n_hidden: {64 if quick else 384}, dropout_rate: 0.05}}
        training: {{batch_size: 16, learning_rate: 0.002, report_count: 3, best_by: cer}}
        early_stop: {{rule: "off"}}
        decoder: {{type: greedy, lm_builder: python}}
        """)
    )
    return path


def french_alphabet(path: Path) -> Path:
    """The French task's alphabet: every character of the grammar, so no dev or test row is lost."""
    from native_client.alphabet import Alphabet

    words = " ".join(SUBJECTS + VERBS + OBJECTS + COMPLEMENTS)
    path.write_text(Alphabet((" ", *sorted(set(words) - {" "}))).to_text(), encoding="utf-8")
    return path


def configs(folder: Path, fr: dict[str, Path], quick: bool, ratio: int, english_epochs: int, weight: float):
    """The three runs' configs: (name, path, the French task's name, "" for the single-task run)."""
    base = base_config(folder, quick)
    alphabet = french_alphabet(folder / "french" / "alphabet.txt")
    french = (
        f"{{train_files: [{fr['train']}], dev_files: [{fr['dev']}], test_files: [{fr['test']}], "
        f"text: {{language: fr}}}}"
    )
    fr_train = sum(1 for _ in open(fr["train"], encoding="utf-8")) - 1
    english = (
        f"{{train_files: [{SAMPLE / 'train.csv'}], dev_files: [{SAMPLE / 'dev.csv'}], "
        f"test_files: [{SAMPLE / 'test.csv'}], limit_train: {ratio * fr_train}, limit_dev: 24, "
        f"limit_test: 8}}"
    )
    french_epochs = ratio * english_epochs
    english_alphabet = ROOT / "data" / "alphabet.txt"
    tasks = {
        "with_english": f"{{name: en, data: {english}, paths: {{alphabet: {english_alphabet}}}}}",
        "with_phonemes": f"{{name: fr_phones, weight: {weight}, targets: phonemes, of: fr, export: false}}",
    }
    runs = {
        "alone": f"training: {{epochs: {french_epochs}}}\npaths: {{alphabet: {alphabet}}}\ndata: {french}\n"
    }
    for name, other in tasks.items():
        epochs = english_epochs if name == "with_english" else french_epochs
        runs[name] = (
            f"training: {{epochs: {epochs}}}\n"
            "multitask:\n  sharing: heads\n  sampling: round_robin\n  tasks:\n"
            f"    - {{name: fr, data: {french}, paths: {{alphabet: {alphabet}}}}}\n"
            f"    - {other}\n"
        )
    found = []
    for name, text in runs.items():
        path = folder / f"{name}.yaml"
        path.write_text(f"extends: {base.name}\n" + text)
        found.append((name, path, "" if name == "alone" else "fr"))
    return found


def _french_dev_cer(best) -> float | None:
    """French's dev CER at the kept checkpoint (a multi-task run's best is by the tasks' weighted mean)."""
    if best is None:
        return None
    return round(best.tasks["fr"]["cer"] if best.tasks else best.cer, 4)


def run(name: str, path: Path, task: str) -> dict:
    """Evaluate (the DAG up to it) of the French task of ``path``; its figures."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.reports import EvaluationReport, TrainReport, read_report

    command = [sys.executable, "-m", "tasks.cli", "Evaluate", "--config", str(path), "--local-scheduler"]
    result = subprocess.run(
        command + (["--task", task] if task else []),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if result.returncode:
        raise SystemExit(
            f"{name}: Evaluate failed (exit {result.returncode}): {result.stderr.strip()[-600:]!r}"
        )
    layout = Layout(load_config(path))
    train = read_report(layout.train_run.report, TrainReport)
    evaluation = read_report(layout.evaluation_report(layout.for_task(task).evaluate_dir), EvaluationReport)
    tasks = {t["name"]: t["batches_drawn"] for t in train.tasks or []}
    return {
        "steps": train.global_step,
        "french_batches": tasks.get("fr", train.global_step),
        "train_wall_s": round(train.wall_time_s, 1),
        "best_dev_cer_fr": _french_dev_cer(train.best_dev),
        "test_cer_fr": round(evaluation.cer, 4),
        "test_wer_fr": round(evaluation.wer, 4),
    }


def main(argv=None) -> int:
    """Make the French corpus, train the three runs, print the table and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few utterances, a tiny model")
    parser.add_argument("--french", type=int, default=160, help="French training utterances")
    parser.add_argument("--english-ratio", type=int, default=4, help="English utterances per French one")
    parser.add_argument("--english-epochs", type=int, default=6, help="epochs of the English run")
    parser.add_argument("--phoneme-weight", type=float, default=0.3, help="the phoneme task's loss weight")
    parser.add_argument("--seed", type=int, default=34)
    args = parser.parse_args(argv)
    counts = {"train": args.french, "dev": 32, "test": 32}
    if args.quick:
        counts, args.english_ratio, args.english_epochs = {"train": 16, "dev": 4, "test": 4}, 2, 1
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fr = french_corpus(folder / "french", counts, args.seed)
        for name, path, task in configs(
            folder, fr, args.quick, args.english_ratio, args.english_epochs, args.phoneme_weight
        ):
            figures[name] = run(name, path, task)
            print(f"{name}: {figures[name]}", flush=True)
    keys = list(figures["alone"])
    print(f"{'':16}" + "".join(f"{name:>15}" for name in figures))
    for key in keys:
        print(f"{key:16}" + "".join(f"{str(figures[name][key]):>15}" for name in figures))
    print(
        json.dumps(
            {
                "quick": args.quick,
                "french_train_utterances": counts["train"],
                "english_ratio": args.english_ratio,
                "test_cer_fr_alone": figures["alone"]["test_cer_fr"],
                "test_cer_fr_with_english": figures["with_english"]["test_cer_fr"],
                "test_cer_fr_with_phonemes": figures["with_phonemes"]["test_cer_fr"],
                **figures,
            }
        )
    )
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    raise SystemExit(main())
