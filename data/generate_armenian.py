"""A small synthetic Armenian corpus spoken by espeak-ng (voice ``hy``), in the armspeech model's alphabet.

Text: simple Eastern Armenian sentences written for this project (released with it)
and phrases with numbers spelled out in words (the generator writes the words, so the
transcripts are exact). Speech: espeak-ng's ``hy`` voice with several variants,
speaking rates and pitches, converted by sox to 16 kHz mono 16-bit FLAC with leading
and trailing silence trimmed.

Writes ``<out>/{train,dev,test}.csv`` (DeepSpeech format, paths relative to the CSV),
the audio under ``<out>/clips/``, ``<out>/alphabet.txt`` (the armspeech model's
alphabet, in its order) and ``<out>/lm_corpus.txt`` (the training sentences).
Sentences are split between train, dev and test, so test sentences are never heard
in training (each sentence is spoken in ``--takes`` voices). Needs espeak-ng and sox.

    python data/generate_armenian.py --out /tmp/hy --takes 3
    python data/generate_armenian.py --sample --out data/armenian   # the 4 clips the tests use
"""

from __future__ import annotations

import argparse
import csv
import random
import subprocess
import sys
import tempfile
from multiprocessing import Pool
from pathlib import Path

# The armspeech model's serialised alphabet, in its order: the space, then 39 lower-case letters
# (U+0561..U+0584, then U+0587 "և", then U+0585, U+0586).
ALPHABET = (" ",) + tuple(chr(c) for c in range(0x561, 0x585)) + ("\u0587", "\u0585", "\u0586")

VARIANTS = ("hy", "hy+m1", "hy+m3", "hy+f2", "hy+f4", "hy+m5")

SENTENCES = """\
ես ապրում եմ երևանում
այսօր եղանակը շատ լավ է
մենք գնում ենք դպրոց
նա կարդում է հետաքրքիր գիրք
իմ եղբայրը բժիշկ է
քաղաքում շատ մարդիկ կան
երեխաները խաղում են բակում
մայրս պատրաստում է ճաշ
հայաստանը գեղեցիկ երկիր է
արարատը բարձր լեռ է
սևանա լիճը մեծ է և խորը
ես սիրում եմ թեյ խմել
վաղը մենք կգնանք գյուղ
նրանք աշխատում են գործարանում
գրադարանում շատ գրքեր կան
ուսուցիչը բացատրում է դասը
ամռանը շոգ է լինում
ձմռանը ձյուն է գալիս
աշնանը տերևները դեղնում են
գարնանը ծաղիկները բացվում են
հայրս աշխատում է հիվանդանոցում
քույրս սովորում է համալսարանում
մեր տունը գտնվում է կենտրոնում
խնձորը կարմիր է և քաղցր
ես ուզում եմ ջուր խմել
շունը վազում է այգում
կատուն քնած է բազմոցին
ավտոբուսը ուշանում է
գնացքը մեկնում է առավոտյան
նամակը ուղարկեցի երեկ
խանութը փակ է կիրակի օրը
հացը թարմ է և տաք
տատիկս պատմում է հեքիաթներ
պապիկս ունի մեծ այգի
այգում աճում են ծիրան և դեղձ
հայկական ծիրանը շատ համեղ է
մենք նստած ենք սեղանի շուրջ
բարև ձեզ ինչպես եք
շնորհակալություն օգնության համար
խնդրում եմ նստեք
ցտեսություն մինչև վաղը
ես չեմ հասկանում
կրկնեք խնդրում եմ
որտեղ է կայարանը
օդանավակայանը հեռու է քաղաքից
ծովը կապույտ է
երկինքը պարզ է այսօր
արևը շողում է
անձրև է գալիս
քամին ուժեղ է
գետը արագ է հոսում
անտառում ապրում են արջեր և գայլեր
թռչունները երգում են առավոտյան
ձուկը լողում է ջրում
ձին արագ է վազում
կովը տալիս է կաթ
մեղուները հավաքում են մեղր
ես գնեցի նոր համակարգիչ
հեռախոսը զանգում է
համերգը սկսվում է երեկոյան
թատրոնում նոր ներկայացում է
ֆիլմը շատ հետաքրքիր էր
երաժշտությունը հանգստացնում է
նա նվագում է դաշնամուր
մենք պարում ենք հարսանիքում
հյուրերը ուրախ են
տոնը լավ անցավ
ամանորին տոնածառ ենք զարդարում
երեխան ծիծաղում է
մայրիկը համբուրում է երեխային
ընկերս ինձ օգնեց
մենք միասին ճանապարհորդեցինք
լեռներում օդը մաքուր է
գյուղում կյանքը հանգիստ է
քաղաքը աղմկոտ է
փողոցում շատ մեքենաներ կան
կամուրջը հին է
եկեղեցին կառուցվել է վաղուց
թանգարանում կան հին ձեռագրեր
մատենադարանը հայտնի է ամբողջ աշխարհում
հայերենն ունի իր այբուբենը
մեսրոպ մաշտոցը ստեղծել է այբուբենը
դպրոցում սովորում ենք մաթեմատիկա
ֆիզիկան հետաքրքիր գիտություն է
բժիշկը նշանակեց դեղ
ես հիվանդ եմ
նա առողջ է
խոհանոցից լավ բույր է գալիս
սուրճը տաք է
պանիրը և հացը սեղանին են
լավաշը հայկական հաց է
խորովածը պատրաստում ենք կրակի վրա
դոլման համեղ ուտեստ է
ջրաղացը աշխատում է գետի մոտ
ճանապարհը տանում է դեպի լիճը
մենք կանգնեցինք կամրջի վրա
նավը լողում է ծովում
աղջիկը նկարում է ծաղիկներ
տղան խաղում է գնդակով
պատուհանը բաց է
դուռը փակ է
սենյակում լույս կա
գիշերը մութ է
լուսինը փայլում է երկնքում
աստղերը շատ են
ես արթնանում եմ վաղ առավոտյան
նա քնում է ուշ
մենք նախաճաշում ենք միասին
ճաշից հետո զբոսնում ենք
երեկոյան դիտում ենք ֆիլմ
շաբաթ օրը գնում ենք շուկա
շուկայում վաճառում են միրգ և բանջարեղեն
լոլիկը և վարունգը թարմ են
կարտոֆիլը էժան է
միսը թանկ է
ձվերը զամբյուղում են
կաթը սառնարանում է
ես կարդում եմ լրագիր
նա գրում է նամակ
մենք խոսում ենք հայերեն
նրանք սովորում են անգլերեն
լեզուն կարևոր է
գիրքը սեղանի վրա է
գրիչը պայուսակում է
տետրը նոր է
աշակերտը պատասխանում է հարցին
դասը ավարտվեց
արձակուրդը սկսվում է ամռանը
ծովափին շատ մարդիկ կան
լողափը տաք է
լեռան գագաթին ձյուն կա
ձորում գետ է հոսում
կիրճը խորն է
վանքը գտնվում է լեռան վրա
գառնին հին տաճար է
գեղարդը քարե վանք է
""".strip().splitlines()

UNITS = ("", "մեկ", "երկու", "երեք", "չորս", "հինգ", "վեց", "յոթ", "ութ", "ինը")
TENS = ("", "տաս", "քսան", "երեսուն", "քառասուն", "հիսուն", "վաթսուն", "յոթանասուն", "ութսուն", "իննսուն")
COUNTED = ("խնձոր", "տարի", "դրամ", "մարդ", "գիրք", "օր", "ժամ", "րոպե", "կիլոմետր", "աշակերտ", "ծառ", "տուն")


def number_words(n: int) -> str:
    """``n`` (0 < n < 1000) in Armenian words as written: ``քսանհինգ``, ``երկու հարյուր տասներեք``."""
    words = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += ([] if hundreds == 1 else [UNITS[hundreds]]) + ["հարյուր"]
    tens, units = divmod(rest, 10)
    if tens == 1 and units == 0:
        words.append("տասը")
    elif tens == 1:
        words.append("տասն" + UNITS[units])
    elif tens or units:
        words.append(TENS[tens] + UNITS[units])
    return " ".join(words)


def number_phrases(rng: random.Random, count: int) -> list[str]:
    """Distinct phrases like ``ես ունեմ քսանհինգ խնձոր`` and ``երեք հարյուր յոթ դրամ``."""
    phrases: set[str] = set()
    openings = ("", "ես ունեմ ", "այստեղ կա ", "մենք տեսանք ", "նա գնեց ", "դասարանում կա ")
    while len(phrases) < count:
        number = rng.choice((rng.randint(1, 20), rng.randint(21, 99), rng.randint(100, 999)))
        phrases.add(rng.choice(openings) + number_words(number) + " " + rng.choice(COUNTED))
    return sorted(phrases)


def synthesise(job: tuple[str, str, str, int, int]) -> float:
    """Speak one text into a 16 kHz FLAC file; return its duration in seconds."""
    text, path, voice, rate, pitch = job
    with tempfile.NamedTemporaryFile(suffix=".wav") as raw:
        subprocess.run(
            ["espeak-ng", "-v", voice, "-s", str(rate), "-p", str(pitch), "-w", raw.name, text], check=True
        )
        subprocess.run(
            [
                "sox",
                raw.name,
                "-r",
                "16000",
                "-c",
                "1",
                "-b",
                "16",
                path,
                "silence",
                "1",
                "0.02",
                "0.5%",
                "reverse",
                "silence",
                "1",
                "0.02",
                "0.5%",
                "reverse",
            ],
            check=True,
        )
    return float(subprocess.run(["soxi", "-D", path], check=True, capture_output=True, text=True).stdout)


def generate(
    out: Path, takes: int, numbers: int, seed: int, dev_fraction: float = 0.1, test_fraction: float = 0.2
) -> dict[str, int]:
    """Write the corpus into ``out``; returns the utterance count per split."""
    rng = random.Random(seed)
    texts = list(dict.fromkeys(SENTENCES)) + number_phrases(rng, numbers)
    unknown = {ch for text in texts for ch in text} - set(ALPHABET)
    if unknown:
        raise SystemExit(f"characters outside the model's alphabet: {sorted(unknown)}")
    rng.shuffle(texts)
    n_test, n_dev = int(len(texts) * test_fraction), int(len(texts) * dev_fraction)
    splits = {"test": texts[:n_test], "dev": texts[n_test : n_test + n_dev], "train": texts[n_test + n_dev :]}
    (out / "clips").mkdir(parents=True, exist_ok=True)
    counts = {}
    with Pool(2) as pool:
        for split, chosen in splits.items():
            jobs = [
                (
                    text,
                    str(out / "clips" / f"{split}-{i:04d}-{take}.flac"),
                    VARIANTS[(i + take) % len(VARIANTS)],
                    rng.randint(120, 190),
                    rng.randint(30, 70),
                )
                for i, text in enumerate(chosen)
                for take in range(takes)
            ]
            pool.map(synthesise, jobs)
            with open(out / f"{split}.csv", "w", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle)
                writer.writerow(["wav_filename", "wav_filesize", "transcript"])
                for text, path, *_ in jobs:
                    writer.writerow([str(Path(path).relative_to(out)), Path(path).stat().st_size, text])
            counts[split] = len(jobs)
    (out / "alphabet.txt").write_text("".join(label + "\n" for label in ALPHABET), encoding="utf-8")
    (out / "lm_corpus.txt").write_text("\n".join(splits["train"]) + "\n", encoding="utf-8")
    return counts


# The clips committed in data/armenian/ for the tests (``--sample``).
SAMPLE_TEXTS = (
    ("բարև ձեզ ինչպես եք", "hy", 150),
    ("ես ապրում եմ երևանում", "hy+f2", 140),
    ("հայաստանը գեղեցիկ երկիր է", "hy+m3", 160),
    ("այսօր եղանակը շատ լավ է", "hy", 130),
)


def write_sample(out: Path) -> None:
    """The few clips the tests use: ``<out>/clips.csv``, ``<out>/NN.flac``, ``<out>/alphabet.txt``."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (text, voice, rate) in enumerate(SAMPLE_TEXTS):
        synthesise((text, str(out / f"{i:02d}.flac"), voice, rate, 50))
        rows.append([f"{i:02d}.flac", (out / f"{i:02d}.flac").stat().st_size, text])
    with open(out / "clips.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["wav_filename", "wav_filesize", "transcript"], *rows])
    (out / "alphabet.txt").write_text("".join(label + "\n" for label in ALPHABET), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sample", action="store_true", help="write only the clips the tests use")
    parser.add_argument("--takes", type=int, default=3, help="voices per sentence")
    parser.add_argument("--numbers", type=int, default=60, help="number phrases besides the sentences")
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args(argv)
    if args.sample:
        write_sample(args.out)
        return 0
    counts = generate(args.out, args.takes, args.numbers, args.seed)
    print(", ".join(f"{split}: {n}" for split, n in counts.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
