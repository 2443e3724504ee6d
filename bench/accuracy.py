"""The model families' accuracy on a corpus bigger and more varied than the sample (issue 46): DeepSpeech
(configs/sample.yaml), the Conformer (configs/sample-conformer.yaml) and the Conformer-Transducer
(configs/sample-transducer.yaml, issue 47: greedy figures only, it reads no LM), each trained for the same
wall-clock budget through the DAG (``deepspeech-train Export`` on a config written here), then their test
CER/WER greedy and with the beam search and the LM, the learning curve (dev CER per epoch) and the time.

The corpus is built once into ``--cache`` and reused (a killed build resumes where it stopped):

- text: sentences of Debian's ``fortunes`` package (English quotations; not the sample's Bible), cut at
  sentence punctuation, lower-cased to the sample's alphabet, 4 to 16 words, none with digits, none that is
  a sample sentence; no dev or test sentence is a train or LM sentence (whole sentences: a short one
  can occur inside a longer one, and one fortune's sentences can fall in different splits);
- speakers: espeak-ng's eight English accents, each with voice variants, a speaking rate of its own
  (110-180 words a minute: at faster rates the Conformer's one output per 40 ms is too few for many
  sentences, which its Features stage then rejects) and a pitch, jittered per sentence (rates 100-190):
  32 speakers, 24 for train, 4 for dev and 4 for test, apart as speakers (no accent with its variant in
  two splits; an accent, or a variant's timbre, can recur with another) (the sample: six voices shared
  by its splits, 145-195);
- ``--train-hours`` (3) of training speech, ``--held-out-minutes`` (15) each of dev and test; the LM corpus
  is the train sentences and the unused ones.

Same wall-clock budget: each family's features and LM are built first (outside the budget; the families
share them where their fingerprints agree), then its Train stage runs with an epoch target raised step by
step (one epoch first, then as many as the time per epoch so far says fit in the rest of
``--budget-minutes``, until less than one epoch's time is left), so both stop at an epoch end within
about an epoch of the budget; each raise is a new process, whose start is counted, and the figures give
the time each actually trained. The families' configs are used as they are, except the data,
``augment.speed_factors: []`` (the sample's 0.9x and 1.1x copies triple an epoch; this corpus has its
speaking rates already) and ``early_stop.rule: off`` (the budget is the stop; ``best_by`` still picks the
checkpoint), and with ``--tune`` ``decoder.tune: true`` (TuneDecoder searches ``lm_alpha`` and ``lm_beta``
on dev before Evaluate, outside the budget; the figures give the weights used as ``lm_alpha_beta``). A
schedule that depends on the epoch target (``lr_decay: cosine``) would be reshaped by each raise, so it
is refused here. ``--recipe conformer=my.yaml`` trains a family with another config of it (a
candidate recipe, to be judged on the dev CER, not the test's). Where a family's Features stage rejects
test utterances the other keeps (too short for their transcripts at its output rate), the figures over
the utterances both kept are given too (``*_common``).

Needs espeak-ng, sox and fortunes (``apt-get install espeak-ng sox fortunes``; installed when run as root
and missing). It is a benchmark: never part of ``make test``.

    python bench/accuracy.py                      # the full run: the corpus once, then 3 x the budget
    python bench/accuracy.py --budget-minutes 40  # another budget, the same cached corpus
    python bench/accuracy.py --families conformer --recipe conformer=candidate.yaml
    python bench/accuracy.py --tune               # each family's LM weights tuned on dev (TuneDecoder)
    python bench/accuracy.py --quick              # a smoke run: a tiny corpus, one epoch each

First line: the CPU; last line: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = {
    "deepspeech": ROOT / "configs" / "sample.yaml",
    "conformer": ROOT / "configs" / "sample-conformer.yaml",
    "transducer": ROOT / "configs" / "sample-transducer.yaml",
}
FORTUNES = Path("/usr/share/games/fortunes")
# What each package gives that the corpus needs (``computers`` is of ``fortunes``, not ``fortunes-min``).
DEBIAN_PACKAGES = {"espeak-ng": "espeak-ng", "sox": "sox", "fortunes": str(FORTUNES / "computers")}
# espeak-ng's own English accents (its mbrola voices need mbrola, which Debian ships apart).
ACCENTS = (
    "en-us", "en", "en-gb-x-rp", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029", "en-us-nyc",
)  # fmt: skip
VARIANTS = ("", "+m1", "+m2", "+m3", "+m4", "+m5", "+m6", "+m7", "+f1", "+f2", "+f3", "+f4", "+f5")
SPEAKERS = {"train": 24, "dev": 4, "test": 4}
CORPUS_VERSION = 1  # bump when the corpus a cache holds would be built otherwise


@dataclass(frozen=True)
class Speaker:
    """One synthetic speaker: an accent with a variant, a speaking rate and a pitch of its own."""

    voice: str
    rate: int
    pitch: int


def speakers(seed: int) -> dict[str, list[Speaker]]:
    """``SPEAKERS`` distinct speakers per split, no voice in two splits, in a seeded draw."""
    rng = random.Random(seed)
    voices = [accent + variant for accent in ACCENTS for variant in VARIANTS]
    rng.shuffle(voices)
    result, start = {}, 0
    for split, count in SPEAKERS.items():
        chosen = voices[start : start + count]
        result[split] = [Speaker(voice, rng.randint(110, 180), rng.randint(20, 80)) for voice in chosen]
        start += count
    return result


def fortune_sentences(folder: Path) -> list[str]:
    """Every fortune of ``folder``'s databases as one line each, attributions (``-- Name``) left out."""
    fortunes = []
    for database in sorted(folder.iterdir()):
        if database.suffix in (".dat", ".u8") or database.is_symlink() or not database.is_file():
            continue
        text = database.read_text(encoding="utf-8", errors="replace")
        for entry in text.split("\n%\n"):
            lines = [line for line in entry.splitlines() if not line.strip().startswith(("--", "—"))]
            fortunes.append(" ".join(line.strip() for line in lines))
    return fortunes


def corpus_texts(seed: int) -> list[str]:
    """The corpus's candidate sentences (see the module's docstring), shuffled with ``seed``."""
    sys.path.insert(0, str(ROOT))
    from data.generate_corpus import clauses

    sample = set((ROOT / "data" / "sample" / "lm_corpus.txt").read_text(encoding="utf-8").splitlines())
    for split in ("train", "dev", "test"):
        with open(ROOT / "data" / "sample" / f"{split}.csv", encoding="utf-8") as handle:
            sample.update(row["transcript"] for row in csv.DictReader(handle))
    texts = [
        text for text in clauses(fortune_sentences(FORTUNES), min_words=4, max_words=16) if text not in sample
    ]
    random.Random(seed).shuffle(texts)
    return texts


def _speak(job: tuple[str, str, str, int, int, int]) -> float:
    """``data/generate_corpus.synthesise`` into a temporary name, renamed when whole (a killed build leaves
    no half-written file a resumed one would take)."""
    from data.generate_corpus import synthesise
    from pipeline.files import atomic_path

    text, path, *voice = job
    with atomic_path(path, suffix=".flac") as partial:  # sox picks the format by the extension
        return synthesise((text, str(partial), *voice))


def speak_split(out: Path, split: str, texts: list[str], voices: list[Speaker], seconds: float, seed: int):
    """Speak ``texts`` in order into ``out/split`` until ``seconds`` of audio exist; write ``split.csv``.
    Progress is appended to ``split.progress.tsv`` as files are done, so a rerun goes on from there.
    Returns the texts spoken."""
    folder = out / split
    folder.mkdir(parents=True, exist_ok=True)
    progress = out / f"{split}.progress.tsv"
    rng = random.Random(f"{seed}-{split}")
    jobs = []
    for index, text in enumerate(texts):
        speaker = rng.choice(voices)
        rate = speaker.rate + rng.randint(-10, 10)
        pitch = min(99, max(0, speaker.pitch + rng.randint(-8, 8)))
        jobs.append(
            (text, str(folder / f"{index:05d}.flac"), speaker.voice, rate, pitch, rng.randint(18, 32))
        )
    done = _progress(progress, jobs)
    total = sum(float(row[1]) for row in done)
    position = len(done)
    with Pool(os.cpu_count() or 1) as pool, open(progress, "a", encoding="utf-8") as log:
        while total < seconds and position < len(jobs):
            chunk = jobs[position : position + 64]
            try:
                lengths = pool.map(_speak, chunk)
            except subprocess.CalledProcessError as error:
                command = " ".join(str(part) for part in error.cmd[:3])
                raise SystemExit(f"{split}: {command} ... failed (exit {error.returncode})") from None
            for job, length in zip(chunk, lengths, strict=True):
                if total >= seconds:
                    break
                done.append([Path(job[1]).name, f"{length:.3f}", job[0]])
                log.write("\t".join(done[-1]) + "\n")
                total += length
            log.flush()
            position += len(chunk)
    if total < seconds:
        raise SystemExit(
            f"{split}: its {len(jobs)} sentences give {total / 60:.1f} minutes of speech, "
            f"{seconds / 60:.1f} asked"
            + (
                "; ask for fewer --train-hours"
                if split == "train"
                else " (its pool assumes 1.5 s a sentence)"
            )
        )
    with open(out / f"{split}.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["wav_filename", "wav_filesize", "transcript"])
        for name, _, text in done:
            writer.writerow([f"{split}/{name}", (folder / name).stat().st_size, text])
    print(f"{split}: {len(done)} utterances, {total / 60:.1f} minutes", flush=True)
    return [text for _, _, text in done]


def _progress(progress: Path, jobs: list) -> list[list[str]]:
    """The rows of ``progress`` that a killed build left whole, in order: name, seconds, text, each
    matching its job. From the first row that does not (a line torn by the kill) on, the rows are dropped
    and the file is cut to the rows kept, so those utterances are spoken again."""
    from pipeline.files import write_text_atomic

    if not progress.exists():
        return []
    lines = progress.read_text(encoding="utf-8").splitlines()
    kept = []
    for row, job in zip((line.split("\t") for line in lines), jobs, strict=False):
        if (
            len(row) != 3
            or row[0] != Path(job[1]).name
            or row[2] != job[0]
            or not re.fullmatch(r"\d+\.\d{3}", row[1])
        ):
            break
        kept.append(row)
    if len(kept) < len(lines):
        write_text_atomic(progress, "".join("\t".join(row) + "\n" for row in kept))
    return kept


def build_corpus(out: Path, train_hours: float, held_out_minutes: float, seed: int) -> dict:
    """The corpus in ``out`` (built now unless ``out/corpus.json`` says it is there); its description."""
    from pipeline.files import write_json_atomic

    summary = out / "corpus.json"
    asked = {"version": CORPUS_VERSION, "train_hours": train_hours, "held_out_minutes": held_out_minutes}
    asked["seed"] = seed
    if summary.exists():
        built = json.loads(summary.read_text())
        if {key: built.get(key) for key in asked} == asked:
            return built
        raise SystemExit(f"{out}: holds another corpus ({summary}); give another --cache or delete it")
    texts, voices = corpus_texts(seed), speakers(seed)
    # A killed build resumes from its progress files only if it was asked for the same corpus of the same
    # text: other sizes or another seed would shift the splits' sentences under the rows already spoken.
    request = {**asked, "texts_sha256": hashlib.sha256("\n".join(texts).encode()).hexdigest()}
    started = out / "request.json"
    if started.exists() and json.loads(started.read_text()) != request:
        raise SystemExit(
            f"{out}: holds a build of another corpus ({started}); give another --cache or delete it"
        )
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(started, request)
    held = int(held_out_minutes * 60 / 1.5) + 50  # more sentences than the minutes can take
    pools = {"test": texts[:held], "dev": texts[held : 2 * held], "train": texts[2 * held :]}
    used = {}
    for split in ("test", "dev", "train"):
        seconds = train_hours * 3600 if split == "train" else held_out_minutes * 60
        used[split] = speak_split(out, split, pools[split], voices[split], seconds, seed)
    lm = used["train"] + pools["train"][len(used["train"]) :]
    (out / "lm_corpus.txt").write_text("\n".join(lm) + "\n", encoding="utf-8")
    built = {
        **asked,
        "utterances": {split: len(rows) for split, rows in used.items()},
        "speakers": {split: [vars(speaker) for speaker in group] for split, group in voices.items()},
        "lm_sentences": len(lm),
    }
    write_json_atomic(summary, built)
    return built


@dataclass(frozen=True)
class Run:
    """What every family's run of one benchmark shares: its work folder, the corpus, the training budget,
    and whether it is a smoke run and tunes the LM weights."""

    folder: Path
    corpus: Path
    budget_s: float
    quick: bool
    tune: bool


def _family_config(run: Run, name: str, recipe: Path, epochs: int) -> Path:
    """The config ``name``'s run trains with: ``recipe`` (its family's config) on the corpus, ``epochs``
    the target."""
    folder, corpus = run.folder, run.corpus
    path = folder / f"{name}.yaml"
    quick_model = ""
    tune = ", tune: true" if run.tune else ""  # else the recipe's
    if run.quick:
        size = "deepspeech: {n_hidden: 64}" if name == "deepspeech" else "conformer: {d_model: 48, layers: 1}"
        quick_model = f"model: {{{size}}}\n"
    path.write_text(
        f"extends: {_quoted(recipe)}\n"
        f"paths: {{work_dir: {_quoted(folder / 'work')}, export_dir: {_quoted(folder / 'models' / name)}}}\n"
        f"data:\n  train_files: [{_quoted(corpus / 'train.csv')}]\n"
        f"  dev_files: [{_quoted(corpus / 'dev.csv')}]\n"
        f"  test_files: [{_quoted(corpus / 'test.csv')}]\n"
        f"augment: {{speed_factors: []}}\n"
        f"early_stop: {{rule: 'off'}}\n"
        f"export: {{card: {{evaluation: true}}}}\n"
        f"decoder: {{lm_corpus_files: [{_quoted(corpus / 'lm_corpus.txt')}]{tune}}}\n"
        f"training: {{epochs: {epochs}}}\n" + quick_model
    )
    return path


def _quoted(path: Path) -> str:
    """``path`` as a YAML scalar that no comma, colon or hash in it can split."""
    return json.dumps(str(path))


def _stage(stage: str, config: Path, name: str) -> float:
    """Run the DAG to ``stage`` for ``config``; its wall time. A failure ends the benchmark in one line."""
    started = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "tasks.cli", stage, "--config", str(config), "--local-scheduler"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if run.returncode:
        lines = run.stderr.strip().splitlines() or ["(no output)"]
        # The command's last line names its log; its "error: ..." line (a stage's one-line error) says
        # what failed.
        said = [line for line in lines if line.startswith("error")] or lines
        raise SystemExit(f"{name}: {stage} failed (exit {run.returncode}): {said[-1]}; {lines[-1]}")
    return time.perf_counter() - started


def train_for_budget(run: Run, name: str, recipe: Path):
    """Train ``name`` through its Train stage in epoch steps until less than an epoch of the budget is
    left (see the module's docstring), after its features and LM (outside the budget); returns its Train
    report, config, the Train stages' wall time and the features' and LM's."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.reports import TrainReport, read_report

    config = _family_config(run, name, recipe, 1)
    prepare_s = _stage("Features", config, name)
    if name != "transducer":  # a transducer reads no LM
        prepare_s += _stage("LanguageModel", config, name)
    target, spent = 0, 0.0
    while True:
        per_epoch = spent / target if target else None
        if per_epoch is not None and run.budget_s - spent < per_epoch:
            break
        target += 1 if per_epoch is None else max(1, int((run.budget_s - spent) // per_epoch))
        config = _family_config(run, name, recipe, target)
        spent += _stage("Train", config, name)
        report = read_report(Layout(load_config(config)).train_run.report, TrainReport)
        print(f"{name}: epoch {report.epochs_completed} of {target} after {spent:.0f} s", flush=True)
        if report.stop.rule is not None or report.epochs_completed < target:
            break
    return report, config, spent, prepare_s


def evaluate_family(run: Run, name: str, recipe: Path) -> dict:
    """``name`` trained with ``recipe`` for the budget, then Evaluate and Export (after TuneDecoder when
    ``--tune`` or the recipe says ``decoder.tune``); its figures."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from pipeline.reports import EvaluationReport, TuneReport, read_report

    train, config, train_s, prepare_s = train_for_budget(run, name, recipe)
    rest_s = _stage("Export", config, name)
    loaded = load_config(config)
    layout = Layout(loaded)
    weights = (loaded.decoder.lm_alpha, loaded.decoder.lm_beta)
    tuned = loaded.decoder.tune
    if tuned:
        best = read_report(layout.tune_report, TuneReport).best
        weights = (best.lm_alpha, best.lm_beta)
    evaluation = read_report(layout.evaluation_report(layout.evaluate_dir), EvaluationReport)
    samples = {
        "greedy": layout.evaluate_dir / evaluation.samples_file,
        "lm": layout.evaluate_dir / evaluation.samples_lm_file if evaluation.samples_lm_file else None,
    }
    curve = [(v["epoch"], v["cer"]) for v in train.validations]
    best_epoch, best_cer = min(curve, key=lambda point: point[1]) if curve else (None, None)

    def rounded(value):
        return None if value is None else round(value, 4)

    return {
        "recipe": str(recipe.relative_to(ROOT) if recipe.is_relative_to(ROOT) else recipe),
        "epochs": train.epochs_completed,
        "stopped_by": train.stop.rule,
        "features_lm_wall_s": round(prepare_s, 1),
        "train_wall_s": round(train_s, 1),
        "export_stage_wall_s": round(rest_s, 1),  # with TuneDecoder's when the weights are tuned
        "best_dev_cer": rounded(best_cer),
        "best_epoch": best_epoch,
        "test_cer_greedy": rounded(evaluation.cer),
        "test_wer_greedy": rounded(evaluation.wer),
        "test_cer_lm": rounded(evaluation.cer_lm),
        "test_wer_lm": rounded(evaluation.wer_lm),
        "lm_alpha_beta": (  # none where no LM decodes (a transducer)
            f"{weights[0]:.3g}/{weights[1]:.3g}" + (" tuned" if tuned else "")
            if evaluation.cer_lm is not None
            else None
        ),
        "test_utterances": evaluation.samples_count,
        "dev_cer_by_epoch": [rounded(cer) for _, cer in curve],
        "_samples": samples,
    }


def _results(path: Path) -> dict:
    """Evaluate's per-utterance results in ``path`` (its samples file) as ``SampleResult``s, by the
    utterance's audio path."""
    from pipeline.evaluation.metrics import SampleResult

    names = [field.name for field in fields(SampleResult)]
    with open(path, encoding="utf-8") as handle:
        rows = (json.loads(line) for line in handle)
        return {row["path"]: SampleResult(**{name: row[name] for name in names}) for row in rows}


def on_common_test_set(figures: dict[str, dict]) -> None:
    """Where the families' Features stages kept different test utterances (a family with fewer outputs a
    second rejects the fastest as too short for their transcripts), add each family's figures over the
    utterances every family kept (``*_common``), so that the comparison is on one test set."""
    from pipeline.evaluation.metrics import corpus_rates

    results = {
        name: {kind: _results(path) for kind, path in f["_samples"].items() if path}
        for name, f in figures.items()
    }
    common = set.intersection(*(set(kinds["greedy"]) for kinds in results.values()))
    if all(set(kinds["greedy"]) == common for kinds in results.values()):
        return
    for name, kinds in results.items():
        figures[name]["test_utterances_common"] = len(common)
        for kind, rows in kinds.items():
            rates = corpus_rates([rows[path] for path in sorted(common)])
            figures[name][f"test_cer_{kind}_common"] = round(rates["cer"], 4)
            figures[name][f"test_wer_{kind}_common"] = round(rates["wer"], 4)


def check_recipe(parser: argparse.ArgumentParser, family: str, recipe: Path) -> None:
    """Refuse, in one line, a recipe of another family or one whose schedule the budget's raises of the
    epoch target would reshape (``lr_decay: cosine``)."""
    from pipeline.config import ConfigError, is_transducer
    from pipeline.config_loader import load_config

    try:
        config = load_config(recipe)
    except ConfigError as error:
        parser.error(f"--recipe {family}={recipe}: {error}")
    # the transducer family is the Conformer trained as a transducer; the others are their architecture
    found = "transducer" if is_transducer(config) else config.model.architecture
    if found != family:
        parser.error(
            f"--recipe {family}={recipe}: a config of model.architecture {config.model.architecture} and "
            f"model.objective {config.model.objective}"
        )
    if config.training.lr_decay == "cosine":
        parser.error(f"{recipe}: lr_decay cosine depends on the epoch target; this budget raises it")


def _tools() -> None:
    """Install what the corpus needs when root and missing; one line naming it otherwise."""
    missing = [
        package
        for package, thing in DEBIAN_PACKAGES.items()
        if not (Path(thing).exists() if thing.startswith("/") else shutil.which(thing))
    ]
    if not missing:
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode:
                last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise SystemExit(f"{' '.join(command)} failed (exit {run.returncode}): {last}")
        return
    raise SystemExit(f"bench/accuracy.py needs {', '.join(missing)}: apt-get install {' '.join(missing)}")


def main(argv=None) -> int:
    """Build (or reuse) the corpus, train and evaluate both families, print the table and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-minutes", type=float, default=20.0, help="training wall time per family")
    parser.add_argument("--train-hours", type=float, default=3.0)
    parser.add_argument("--held-out-minutes", type=float, default=15.0, help="of dev, and of test")
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path.home() / ".cache" / "luigi-deepspeech" / "accuracy-corpus",
        help="where the corpus is built once",
    )
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    parser.add_argument(
        "--recipe",
        action="append",
        default=[],
        metavar="FAMILY=CONFIG",
        help="train FAMILY with CONFIG (a config of that family) instead of its sample config; repeatable",
    )
    parser.add_argument("--keep", type=Path, help="keep the work directory and exports here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a tiny corpus and models")
    parser.add_argument(
        "--tune", action="store_true", help="tune each family's LM weights on dev first (decoder.tune)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.budget_minutes, args.train_hours, args.held_out_minutes = 0.1, 0.05, 1.0
        args.cache = args.cache.with_name(args.cache.name + "-quick")
    for key in ("budget_minutes", "train_hours", "held_out_minutes"):
        if getattr(args, key) <= 0:
            parser.error(f"--{key.replace('_', '-')} {getattr(args, key)}: expected a value above 0")
    # Absolute: the written configs' paths would otherwise be read against the configs' own folder.
    args.cache = args.cache.expanduser().resolve()
    args.keep = args.keep.expanduser().resolve() if args.keep else None
    args.families = list(dict.fromkeys(args.families))  # a family named twice would reuse its finished run
    recipes = dict(FAMILIES)
    for given in args.recipe:
        family, _, path = given.partition("=")
        if family not in FAMILIES or not path:
            parser.error(f"--recipe {given}: expected FAMILY=CONFIG, FAMILY one of {', '.join(FAMILIES)}")
        if not Path(path).is_file():
            parser.error(f"--recipe {given}: {path} is not a file")
        recipes[family] = Path(path).resolve()
    for family in args.families:
        check_recipe(parser, family, recipes[family])
    if args.keep and (args.keep.is_file() or (args.keep.exists() and any(args.keep.iterdir()))):
        parser.error(
            f"--keep {args.keep}: not an empty folder; the budget counts from a fresh work directory"
        )
    _tools()
    started = time.perf_counter()
    corpus = build_corpus(args.cache, args.train_hours, args.held_out_minutes, args.seed)
    corpus_s = round(time.perf_counter() - started, 1)
    print(f"corpus: {args.cache}, {corpus['utterances']}, {corpus_s} s", flush=True)
    figures: dict[str, dict] = {}
    # The runs' work directory: kept where --keep says, else removed after a run that succeeded (a failed
    # one's logs stay, and the error names them).
    folder = args.keep or Path(tempfile.mkdtemp(prefix="accuracy-run-", dir=args.cache.parent))
    folder.mkdir(parents=True, exist_ok=True)
    run = Run(folder, args.cache, args.budget_minutes * 60, args.quick, args.tune)
    try:
        for name in args.families:
            figures[name] = evaluate_family(run, name, recipes[name])
            print(
                f"{name}: { {key: value for key, value in figures[name].items() if key != '_samples'} }",
                flush=True,
            )
        on_common_test_set(figures)
    except BaseException:
        # Whatever ends the run (a stage's error, Ctrl-C, a report that cannot be read), its logs and
        # checkpoints stay, and the user is told where.
        print(f"the run's work directory is kept: {folder}", file=sys.stderr, flush=True)
        raise
    for name in figures:
        del figures[name]["_samples"]
    if not args.keep:
        shutil.rmtree(folder)
    keys = list(dict.fromkeys(key for name in figures for key in figures[name] if key != "dev_cer_by_epoch"))
    print(f"{'':22}" + "".join(f"{name:>30}" for name in figures))
    for key in keys:
        print(f"{key:22}" + "".join(f"{str(figures[name].get(key, '-')):>30}" for name in figures))
    for name in figures:
        print(f"{name} dev CER by epoch: {figures[name]['dev_cer_by_epoch']}")
    summary = {key: value for key, value in corpus.items() if key != "speakers"} | {"wall_s": corpus_s}
    print(
        json.dumps({"quick": args.quick, "budget_minutes": args.budget_minutes, "corpus": summary} | figures)
    )
    return 0


if __name__ == "__main__":
    from cpu_info import cpu_line  # bench/, the folder of the script

    print(cpu_line(), flush=True)
    raise SystemExit(main())
