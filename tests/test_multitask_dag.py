"""Issue 34 item 2: the DAG per task. Each task's stages take ``--task``, one Train reads every task, and
the fingerprints follow the graph: a task's changed manifest moves its own stages, Train and what follows,
never another task's features."""

from __future__ import annotations

import textwrap

import pytest

from pipeline.config import ConfigError
from pipeline.config_loader import load_config
from pipeline.dag import SPLITS
from pipeline.layout import Layout
from pipeline.stages.gc import reached_nodes
from tests.corpus_factory import sample_rows, write_manifest


def _manifests(folder, offset: int) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    return {
        split: write_manifest(
            folder / f"{split}.csv", [(str(a), t) for a, t in sample_rows(split, 3 + offset)]
        )
        for split in SPLITS
    }


def _config(tmp_path, sharing: str = "heads", extra_task: str = "", top: str = "") -> object:
    en, fr = _manifests(tmp_path / "en", 0), _manifests(tmp_path / "fr", 1)
    path = tmp_path / f"multi-{sharing}.yaml"
    path.write_text(
        textwrap.dedent(f"""
        paths: {{work_dir: {tmp_path / "work"}, export_dir: {tmp_path / "export"}}}
        decoder: {{lm_builder: python}}
        """)
        + top
        + textwrap.dedent(f"""
        multitask:
          sharing: {sharing}
          tasks:
            - name: en
              data: {{train_files: [{en["train"]}], dev_files: [{en["dev"]}], test_files: [{en["test"]}]}}
              paths: {{alphabet: auto}}
            - name: fr
              data:
                train_files: [{fr["train"]}]
                dev_files: [{fr["dev"]}]
                test_files: [{fr["test"]}]
                text: {{language: fr}}
              paths: {{alphabet: auto, export_dir: {tmp_path / "fr-model"}}}
        """)
        + extra_task
    )
    return path, en, fr


def _fingerprints(path) -> dict:
    layout = Layout(load_config(path))
    found = {"train": layout.train_fingerprint}
    for task in ("en", "fr"):
        child = layout.for_task(task)
        found.update(
            {
                f"{task}.alphabet": child.fingerprint("alphabet"),
                **{f"{task}.features.{split}": child.features_fingerprint(split) for split in SPLITS},
                f"{task}.lm": child.lm_fingerprint,
                f"{task}.evaluate": child.evaluate_fingerprint,
                f"{task}.export": child.export_fingerprint,
            }
        )
    return found


def test_a_changed_task_manifest_moves_its_stages_train_and_what_follows_only(tmp_path):
    path, en, fr = _config(tmp_path)
    before = _fingerprints(path)
    assert before["en.features.train"] != before["fr.features.train"]
    assert before["en.evaluate"] != before["fr.evaluate"]
    with open(fr["train"], "a") as handle:  # one more French training row
        audio, transcript = sample_rows("train", 5)[4]
        handle.write(f"{audio},{audio.stat().st_size},{transcript}\n")
    after = _fingerprints(path)
    moved = sorted(key for key in before if before[key] != after[key])
    assert moved == [
        "en.evaluate",  # the shared Train moved
        "en.export",
        "fr.alphabet",
        "fr.evaluate",
        "fr.export",
        "fr.features.dev",  # through fr's alphabet
        "fr.features.test",
        "fr.features.train",
        "fr.lm",  # it reads the training transcripts (decoder.lm_include_train)
        "train",
    ]


def test_each_task_has_its_own_directories_and_a_task_with_the_data_of_a_single_task_run_shares_its_caches(
    tmp_path,
):
    path, en, _ = _config(tmp_path)
    layout = Layout(load_config(path))
    fr = layout.for_task("fr")
    assert fr.task == "fr" and fr.train_run.root == layout.train_run.root
    assert layout.for_task("en").export_root == tmp_path / "export" / "en"
    assert fr.export_root == tmp_path / "fr-model"  # the task's own paths.export_dir
    assert fr.evaluate_dir.name == f"fr-{fr.evaluate_fingerprint}"
    assert fr.alphabet == fr.alphabet_files.alphabet != layout.for_task("en").alphabet
    single = tmp_path / "single.yaml"
    single.write_text(
        f"paths: {{work_dir: {tmp_path / 'work'}, alphabet: auto}}\n"
        f"data: {{train_files: [{en['train']}], dev_files: [{en['dev']}], test_files: [{en['test']}]}}\n"
    )
    alone = Layout(load_config(single))
    assert alone.features_cache("train") == layout.for_task("en").features_cache("train")
    assert alone.alphabet_files == layout.for_task("en").alphabet_files
    assert alone.train_fingerprint != layout.train_fingerprint


def test_a_stage_that_runs_per_task_asked_without_one_is_a_one_line_error(tmp_path):
    path, _, _ = _config(tmp_path)
    layout = Layout(load_config(path))
    with pytest.raises(
        ConfigError, match=r"runs FeaturesSplit once per task: give its task \(--task en \| fr\)"
    ):
        layout.features_cache("train")
    with pytest.raises(ConfigError, match=r"multitask\.tasks has no task 'de'; its tasks: en, fr"):
        layout.for_task("de")


@pytest.mark.usefixtures("tasks_in_process")
def test_the_luigi_tasks_take_the_task_and_train_reads_every_task(tmp_path):
    from tasks import Evaluate, Export, Features, Train, Transcribe
    from tasks.rerun import dag, dag_roots

    path, _, _ = _config(
        tmp_path, extra_task="    - {name: aux, data: {train_files: [x.csv]}, export: false}\n"
    )
    config = str(path)
    needs = Evaluate(config=config, task="fr").requires()
    assert sorted(needs) == ["alphabet_fr", "features_test_fr", "lm_fr", "train"]
    assert needs["features_test_fr"].task == "fr"
    assert sorted(Train(config=config).requires()) == [
        "alphabet_en",  # aux reads the default alphabet file, no Alphabet stage
        "alphabet_fr",
        "features_dev_en",
        "features_dev_fr",
        "features_train_aux",
        "features_train_en",
        "features_train_fr",
    ]
    roots = {(type(t).__name__, t.task) for t in dag_roots(config, {"audio": None})}
    assert roots == {
        ("Evaluate", "en"),
        ("Evaluate", "fr"),
        ("Evaluate", "aux"),
        ("Export", "en"),
        ("Export", "fr"),
    }
    assert {(type(t).__name__, t.task) for t in dag_roots(config, {"audio": "a.wav"})} >= {
        ("Transcribe", "en"),
        ("Transcribe", "fr"),
    }
    graph = dag(dag_roots(config, {"audio": None}))
    assert len([t for t in graph.values() if type(t).__name__ == "Train"]) == 1
    assert Export(config=config, task="fr").output().path.startswith(str(tmp_path / "fr-model"))
    assert Transcribe(config=config, task="fr", audio="a.wav").requires()["export_fr"].task == "fr"
    features = Features(config=config).requires()
    assert {(f.task, f.split) for f in features} == {
        ("en", "train"),
        ("en", "dev"),
        ("en", "test"),
        ("fr", "train"),
        ("fr", "dev"),
        ("fr", "test"),
        ("aux", "train"),
    }
    assert {f.task for f in Features(config=config, task="fr").requires()} == {"fr"}
    reached = {(name, params.get("task")) for name, params in reached_nodes(load_config(path))}
    assert {("features", "fr"), ("features", "en"), ("evaluate", "aux"), ("train", None)} <= reached


def test_shared_sharing_has_one_alphabet_built_from_every_task(tmp_path):
    path, en, fr = _config(tmp_path, sharing="shared")
    layout = Layout(load_config(path))
    assert (
        layout.for_task("en").alphabet_files == layout.for_task("fr").alphabet_files == layout.alphabet_files
    )
    sources = layout.alphabet_sources()
    assert [manifests for manifests, _, _ in sources] == [(str(en["train"]),), (str(fr["train"]),)]
    assert [text.language for _, _, text in sources] == ["", "fr"]
    before = layout.alphabet_files
    with open(fr["train"], "a") as handle:
        audio, transcript = sample_rows("train", 5)[4]
        handle.write(f"{audio},{audio.stat().st_size},{transcript}\n")
    assert Layout(load_config(path)).alphabet_files != before


@pytest.mark.usefixtures("tasks_in_process")
def test_a_task_of_corpora_imports_them_once_and_its_phonemes_task_reads_its_imports(tmp_path):
    from tasks import Features, Imports, Phonemes
    from tests.corpus_layouts import librispeech_speech

    corpus = librispeech_speech(tmp_path / "corpus", {"train": 4, "dev": 2, "test": 2})
    path = tmp_path / "corpora.yaml"
    path.write_text(
        textwrap.dedent(f"""
        paths: {{work_dir: {tmp_path / "work"}}}
        multitask:
          tasks:
            - {{name: en, data: {{corpora: [{{importer: librispeech, path: {corpus / "LibriSpeech"}}}]}}}}
            - {{name: en_phones, weight: 0.3, targets: phonemes, of: en, export: false}}
        """)
    )
    config = str(path)
    imports = Imports(config=config).requires()
    assert [(i.corpus, i.task) for i in imports] == [("librispeech-LibriSpeech", "en")]
    needs = Phonemes(config=config, task="en_phones").requires()
    assert [(t.corpus, t.task) for t in needs.values()] == [("librispeech-LibriSpeech", "en")]
    features = {(f.task, f.split): f.requires() for f in Features(config=config).requires()}
    assert set(features[("en_phones", "train")]) == {"phonemes_en_phones", "alphabet_en_phones"}
    assert set(features[("en", "dev")]) == {"import_librispeech-LibriSpeech_en"}
    layout = Layout(load_config(path))
    assert layout.for_task("en_phones").corpora == {}
    assert layout.for_task("en_phones").phonemes_files.root.name.startswith("en_phones-")


@pytest.mark.usefixtures("tasks_in_process")
def test_make_rerun_of_a_tasks_stage_removes_it_and_what_follows_only(tmp_path, capsys):
    from tasks.rerun import main

    path, _, _ = _config(tmp_path)
    layout = Layout(load_config(path))
    en, fr = layout.for_task("en"), layout.for_task("fr")
    argv = ["FeaturesSplit", "--split", "train", "--task", "fr", "--config", str(path), "--dry-run"]
    assert main([*argv, "--local-scheduler"]) == 0
    removed = {line.split()[2] for line in capsys.readouterr().out.splitlines()}
    assert {str(fr.features_cache("train")), str(layout.train_run.root), str(en.evaluate_dir)} <= removed
    assert str(fr.evaluate_dir) in removed and str(fr.alphabet_files.root) not in removed
    assert not any(str(en.features_cache(split)) in removed for split in ("train", "dev", "test"))
    assert main(["Evaluate", "--config", str(path), "--dry-run", "--local-scheduler"]) == 0
    removed = {line.split()[2] for line in capsys.readouterr().out.splitlines()}
    assert removed == {str(en.evaluate_dir), str(fr.evaluate_dir)}  # every task's Evaluate, nothing before
