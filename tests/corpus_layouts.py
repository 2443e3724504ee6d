"""Miniature corpora in the exact on-disk layouts of the real releases, for the importer tests.

Audio is tones (each utterance its own frequency, so a test can tell which audio a row points at),
written by soundfile in the corpus's own format: FLAC (LibriSpeech, MLS), MP3 (Common Voice), NIST
SPHERE (TED-LIUM, TIMIT), WAV (M-AILABS, Kaldi, folders).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import soundfile


def tone(path: Path, seconds: float, frequency: float, rate: int = 16000, **write) -> Path:
    """Write a sine tone of ``seconds`` at ``frequency`` Hz (amplitude 0.5) to ``path``; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(path, (0.5 * np.sin(2 * np.pi * frequency * t)).astype(np.float32), rate, **write)
    return path


def librispeech(root: Path) -> Path:
    """``LibriSpeech/`` with train-clean-100 (2 speakers, a missing FLAC), dev-clean and test-clean
    (1 speaker each) and a chapter without its transcript file; returns the folder holding it."""
    base = root / "LibriSpeech"
    layout = {
        "train-clean-100": {
            "19": {"198": ["HELLO WORLD", "A SECOND LINE"]},
            "26": {"495": ["THIRD ONE HERE"]},
        },
        "dev-clean": {"84": {"121123": ["DEV SPEECH"]}},
        "test-clean": {"1089": {"134686": ["TEST SPEECH", "MORE TEST"]}},
    }
    frequency = 200
    for part, speakers in layout.items():
        for speaker, chapters in speakers.items():
            for chapter, lines in chapters.items():
                folder = base / part / speaker / chapter
                folder.mkdir(parents=True)
                with open(folder / f"{speaker}-{chapter}.trans.txt", "w") as handle:
                    for index, text in enumerate(lines):
                        ident = f"{speaker}-{chapter}-{index:04d}"
                        handle.write(f"{ident} {text}\n")
                        frequency += 20
                        tone(folder / f"{ident}.flac", 1.0 + 0.1 * index, frequency)
    (base / "train-clean-100" / "26" / "495" / "26-495-0000.flac").unlink()  # listed, not there
    (base / "train-clean-100" / "26" / "500").mkdir()  # a chapter folder without a transcript
    tone(base / "train-clean-100" / "26" / "500" / "26-500-0000.flac", 1.0, 900)
    (base / "README.TXT").write_text("LibriSpeech ASR corpus\n")
    return root


def mls(root: Path) -> Path:
    """``mls_french_opus/`` with train (Opus audio, 2 speakers) and dev, test (1 speaker each)."""
    base = root / "mls_french_opus"
    rows = {
        "train": [
            ("10065", "10082", "000001", "bonjour à tous"),
            ("10087", "10082", "000002", "une deuxième phrase"),
        ],
        "dev": [("1591", "1127", "000003", "le développement")],
        "test": [("1713", "1127", "000004", "un essai")],
    }
    for part, lines in rows.items():
        (base / part).mkdir(parents=True)
        with open(base / part / "transcripts.txt", "w", encoding="utf-8") as handle:
            for speaker, book, number, text in lines:
                ident = f"{speaker}_{book}_{number}"
                handle.write(f"{ident}\t{text}\n")
                tone(
                    base / part / "audio" / speaker / book / f"{ident}.opus",
                    1.0,
                    300,
                    format="OGG",
                    subtype="OPUS",
                )
    return base


CV_HEADER_V4 = ["client_id", "path", "sentence", "up_votes", "down_votes", "age", "gender", "accent"]
CV_HEADER_V17 = [
    "client_id",
    "path",
    "sentence_id",
    "sentence",
    "sentence_domain",
    "up_votes",
    "down_votes",
    "age",
    "gender",
    "accents",
    "variant",
    "locale",
    "segment",
]


def common_voice(root: Path, header: list[str] = CV_HEADER_V17) -> tuple[Path, dict]:
    """A Common Voice language folder (``fr``) with MP3 clips and the release's TSVs, holding the traps
    of the real releases: quotes and commas in sentences, an unbalanced quote, a CSV-quoted field,
    a missing clip, an empty (0-byte) clip, a BOM before the header, NFD-accented text, a row with
    a field too many, and validated.tsv sharing speakers with dev/test. Returns (folder, the
    expected outcome of each train/dev/test row by clip name: normalised text or drop reason)."""
    base = root / "fr"
    clips = base / "clips"
    clips.mkdir(parents=True)
    nfd = unicodedata.normalize("NFD", "Le café était fermé")
    rows = {
        "train": [
            ("spk_a", "a1.mp3", 'Il a dit "non", puis il est parti.', "il a dit non puis il est parti"),
            ("spk_a", "a2.mp3", "L'homme, la femme et l’enfant", "l'homme la femme et l'enfant"),
            ("spk_b", "b1.mp3", nfd, "le café était fermé"),
            ("spk_b", "b2.mp3", '"Un guillemet seul', "un guillemet seul"),
            ("spk_b", "b3.mp3", '"Elle a dit ""oui"" hier"', "elle a dit oui hier"),
            ("spk_c", "missing.mp3", "Ce clip manque", "missing_file"),
            ("spk_c", "empty.mp3", "Ce clip est vide", "empty_audio"),
            ("spk_c", "c1.mp3", "...", "empty_transcript"),
        ],
        "dev": [("spk_d", "d1.mp3", "Une phrase de développement", "une phrase de développement")],
        "test": [("spk_e", "e1.mp3", "Une phrase de test", "une phrase de test")],
    }
    frequency = 300
    for part, lines in rows.items():
        with open(base / f"{part}.tsv", "w", encoding="utf-8", newline="") as handle:
            if part == "train":
                handle.write("\ufeff")
            handle.write("\t".join(header) + "\n")
            for speaker, clip, sentence, _ in lines:
                values = {name: "" for name in header}
                values.update(client_id=speaker, path=clip, sentence=sentence, up_votes="2", down_votes="0")
                handle.write("\t".join(values[name] for name in header) + "\n")
                if clip not in ("missing.mp3", "empty.mp3"):
                    frequency += 25
                    tone(clips / clip, 1.2, frequency, rate=48000, format="MP3")
            if part == "train":
                handle.write("\t".join(["spk_f", "f1.mp3", "too", "many"] + [""] * len(header)) + "\n")
    (clips / "empty.mp3").write_bytes(b"")
    with open(base / "validated.tsv", "w", encoding="utf-8", newline="") as handle:
        handle.write("\t".join(header) + "\n")
        for speaker, clip, sentence in [
            ("spk_a", "a1.mp3", "Il a dit non"),
            ("spk_d", "d1.mp3", "Une phrase de développement"),
            ("spk_d", "d2.mp3", "Une autre phrase du même locuteur"),
            ("spk_g", "g1.mp3", "Une phrase validée"),
        ]:
            values = {name: "" for name in header}
            values.update(client_id=speaker, path=clip, sentence=sentence)
            handle.write("\t".join(values[name] for name in header) + "\n")
    tone(clips / "d2.mp3", 1.0, 700, rate=48000, format="MP3")
    tone(clips / "g1.mp3", 1.0, 720, rate=48000, format="MP3")
    (base / "reported.tsv").write_text("sentence_id\tsentence\tlocale\treason\n")
    expected = {clip: outcome for lines in rows.values() for _, clip, _, outcome in lines}
    return base, expected


STM = """;; TED-LIUM style comments
{talk} 1 {talk} 0.00 1.50 <o,f0,male> it 's a good day {{NOISE}}
{talk} 1 {talk} 1.50 2.00 <o,f0,male> ignore_time_segment_in_scoring
{talk} 1 {talk} 2.00 3.20 <o,f0,male> we do n't know the <unk> here
{talk} 1 {talk} 3.20 4.40 <o,f0,male> they 're back in the ' 60s
{talk} 1 {talk} 4.40 9.00 <o,f0,male> this runs past the end
"""


def tedlium(root: Path) -> Path:
    """``TEDLIUM_release-3/`` with ``legacy/{train,dev,test}`` (one 5 s SPHERE talk each) and ``data``."""
    base = root / "TEDLIUM_release-3"
    for index, part in enumerate(("legacy/train", "legacy/dev", "legacy/test", "data")):
        talk = f"Speaker{index}_2010X"
        tone(base / part / "sph" / f"{talk}.sph", 5.0, 250 + 50 * index, format="NIST", subtype="PCM_16")
        (base / part / "stm").mkdir(parents=True)
        (base / part / "stm" / f"{talk}.stm").write_text(STM.format(talk=talk))
    (base / "doc").mkdir()
    return base


def timit(root: Path, lower: bool = False) -> Path:
    """A TIMIT copy (``TIMIT/TRAIN``, ``TIMIT/TEST``; lower-case names with ``lower``) with one training
    speaker, one dev speaker (FADG0), one core-test speaker (MDAB0) and one other TEST speaker
    (MRJO0); each reads SA1 and one SX sentence; the Kaggle-style ``.WAV.wav`` copies sit beside."""
    base = root / ("timit" if lower else "TIMIT")

    def name(text: str) -> str:
        return text.lower() if lower else text

    speakers = [
        ("TRAIN", "DR1", "FCJF0"),
        ("TEST", "DR1", "FADG0"),
        ("TEST", "DR1", "MDAB0"),
        ("TEST", "DR2", "MRJO0"),
    ]
    frequency = 300
    for part, region, speaker in speakers:
        folder = base / name(part) / name(region) / name(speaker)
        for sentence, text in (
            ("SA1", "She had your dark suit in greasy wash water all year."),
            ("SX4", "Don't ask me."),
        ):
            frequency += 30
            audio = tone(folder / name(f"{sentence}.WAV"), 1.0, frequency, format="NIST", subtype="PCM_16")
            tone(
                folder / (audio.name + ".wav"), 1.0, 50, subtype="PCM_16"
            )  # a converted copy, not to be used
            (folder / name(f"{sentence}.TXT")).write_text(f"0 16000 {text}\n")
            words = [w.strip(".").lower() for w in text.split()]
            (folder / name(f"{sentence}.WRD")).write_text(
                "".join(f"{i * 1000} {(i + 1) * 1000} {w}\n" for i, w in enumerate(words))
            )
    return root


def mailabs(root: Path) -> Path:
    """``en_US/by_book`` with a female speaker (two books), a male speaker and a mix book; one line with
    only two fields, one with a missing WAV."""
    base = root / "en_US" / "by_book"
    books = {
        ("female", "judy_bieber", "emerald_city"): [
            ("ec_01_f000001", "Chapter 1.", "Chapter one."),
            ("ec_01_f000002", "It was 3 o'clock.", "It was three o'clock."),
        ],
        ("female", "judy_bieber", "ozma"): [("oz_01_f000001", "Ozma of Oz", None)],
        ("male", "elliot_miller", "pink_fairy"): [
            ("pf_01_f000001", "The pink fairy", "The pink fairy"),
            ("pf_01_f000002", "Gone", "Gone"),
        ],
        ("mix", None, "mixed_book"): [("mb_01_f000001", "Many voices", "Many voices")],
    }
    frequency = 300
    for (gender, speaker, book), lines in books.items():
        folder = base / gender / speaker / book if speaker else base / gender / book
        (folder / "wavs").mkdir(parents=True)
        with open(folder / "metadata.csv", "w", encoding="utf-8") as handle:
            for ident, text, normalised in lines:
                handle.write("|".join([ident, text] + ([normalised] if normalised else [])) + "\n")
                if ident != "pf_01_f000002":
                    frequency += 30
                    tone(folder / "wavs" / f"{ident}.wav", 1.0, frequency, subtype="PCM_16")
    return root / "en_US"


def kaldi(root: Path) -> Path:
    """A Kaldi data directory: two recordings (a WAV and a FLAC named through ``flac -c -d -s ... |``),
    a piped sox speed-perturbation command, segments (one to the end, -1), text, utt2spk."""
    data = root / "data" / "train"
    audio = root / "audio"
    tone(audio / "rec1.wav", 4.0, 400, subtype="PCM_16")
    tone(audio / "rec2.flac", 3.0, 500)
    data.mkdir(parents=True)
    (data / "wav.scp").write_text(
        f"rec1 {audio / 'rec1.wav'}\n"
        f"rec2 flac -c -d -s {audio / 'rec2.flac'} |\n"
        f"rec3 sox {audio / 'rec1.wav'} -t wav - speed 1.1 |\n"
    )
    (data / "segments").write_text(
        "spk1-rec1-a rec1 0.00 1.50\nspk1-rec1-b rec1 1.50 -1\n"
        "spk2-rec2-a rec2 0.50 2.50\nspk2-rec3-a rec3 0.00 1.00\n"
    )
    (data / "text").write_text(
        "spk1-rec1-a FIRST SEGMENT\nspk1-rec1-b SECOND SEGMENT\n"
        "spk2-rec2-a FROM THE FLAC\nspk2-rec3-a FASTER\n"
    )
    (data / "utt2spk").write_text("spk1-rec1-a spk1\nspk1-rec1-b spk1\nspk2-rec2-a spk2\nspk2-rec3-a spk2\n")
    return data


def folder(root: Path, speakers: int = 0) -> Path:
    """Audio files with same-name ``.txt`` transcripts: ``alice/`` (WAV, FLAC in a sub-folder), ``bob/``
    (MP3), a WavPack file (converted once), a file without transcript, a stray ``.txt``; with
    ``speakers``, that many more speaker folders of one WAV each (for split tests)."""
    base = root / "recordings"
    tone(base / "alice" / "001.wav", 1.0, 300, subtype="PCM_16")
    (base / "alice" / "001.txt").write_text("Hello there\n")
    tone(base / "alice" / "day2" / "002.flac", 1.0, 330)
    (base / "alice" / "day2" / "002.txt").write_text("General Kenobi\n")
    tone(base / "bob" / "001.mp3", 1.0, 360, format="MP3")
    (base / "bob" / "001.txt").write_text("Bob speaks\n")
    tone(base / "bob" / "002.wav", 1.0, 390, subtype="PCM_16")
    (base / "notes.txt").write_text("not a transcript of anything\n")
    for index in range(speakers):
        tone(base / f"speaker{index:03d}" / "a.wav", 0.2, 300 + index, subtype="PCM_16")
        (base / f"speaker{index:03d}" / "a.txt").write_text(f"utterance of speaker {index}\n")
    return base


def _sample_rows(split: str, count: int) -> list[tuple[Path, str]]:
    """(audio, transcript) of the first ``count`` rows of the sample corpus's ``split`` (data/sample)."""
    import csv

    sample = Path(__file__).resolve().parent.parent / "data" / "sample"
    with open(sample / f"{split}.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))[:count]
    assert len(rows) == count, f"the sample's {split} split has fewer than {count} rows"
    return [(sample / row["wav_filename"], row["transcript"]) for row in rows]


def librispeech_speech(root: Path, counts: dict[str, int], per_speaker: int = 4) -> Path:
    """``LibriSpeech/`` with ``train-clean-100``, ``dev-clean`` and ``test-clean`` holding speech: the
    sample corpus's FLAC files of the same split (``counts[split]`` of them), ``per_speaker`` per speaker
    (one chapter each, speaker ids of their own per split), transcripts upper-cased as LibriSpeech writes
    them. Returns the folder holding ``LibriSpeech/``."""
    import shutil

    parts = {"train": "train-clean-100", "dev": "dev-clean", "test": "test-clean"}
    for number, (split, part) in enumerate(parts.items(), 1):
        for index, (audio, text) in enumerate(_sample_rows(split, counts[split])):
            speaker, chapter = f"{number}{index // per_speaker:02d}", f"{number}{index // per_speaker:03d}0"
            folder = root / "LibriSpeech" / part / speaker / chapter
            folder.mkdir(parents=True, exist_ok=True)
            ident = f"{speaker}-{chapter}-{index % per_speaker:04d}"
            shutil.copy(audio, folder / f"{ident}.flac")
            with open(folder / f"{speaker}-{chapter}.trans.txt", "a", encoding="utf-8") as handle:
                handle.write(f"{ident} {text.upper()}\n")
    return root


def common_voice_speech(root: Path, counts: dict[str, int], per_speaker: int = 4, missing: int = 1) -> Path:
    """A Common Voice language folder (``en``) of the MP3 release layout holding speech: the sample
    corpus's audio of each split resampled to 48 kHz (soxr) and written as MP3 clips by soundfile,
    ``train.tsv``/``dev.tsv``/``test.tsv`` (the v17 header) with each sentence capitalised and ending
    with a full stop, a speaker (``client_id``) every ``per_speaker`` clips, none shared by two splits,
    and ``missing`` train rows whose clip is absent (as releases have). Returns the language folder."""
    import soxr

    base = root / "cv-corpus-17.0-2024-03-15" / "en"
    (base / "clips").mkdir(parents=True)
    for split, count in counts.items():
        with open(base / f"{split}.tsv", "w", encoding="utf-8", newline="") as handle:
            handle.write("\t".join(CV_HEADER_V17) + "\n")
            rows = _sample_rows(split, count)
            extra = [(None, "a clip the release lost")] * (missing if split == "train" else 0)
            for index, (audio, text) in enumerate(rows + extra):
                clip = f"common_voice_en_{split}_{index:05d}.mp3"
                values = {name: "" for name in CV_HEADER_V17}
                values.update(
                    client_id=f"{split}{index // per_speaker:03d}" + "f" * 40,
                    path=clip,
                    sentence=text[:1].upper() + text[1:] + ".",
                    up_votes="2",
                    down_votes="0",
                    locale="en",
                )
                handle.write("\t".join(values[name] for name in CV_HEADER_V17) + "\n")
                if audio is not None:
                    samples, rate = soundfile.read(audio, dtype="float32")
                    clip_48k = soxr.resample(samples, rate, 48000)
                    soundfile.write(base / "clips" / clip, clip_48k, 48000, format="MP3")
    return base
