"""Issue 34 item 1: ``multitask:`` in the config, its task views and its one-line errors."""

from __future__ import annotations

import pytest

from pipeline.config import PHONEME_TEXT, ConfigError
from pipeline.config_loader import config_to_dict, load_config
from tests.conftest import ROOT

ISSUE_SHAPE = """
paths: {{work_dir: {work}, alphabet: auto}}
data: {{limit_train: 40}}
decoder: {{lm_order: 3}}
multitask:
  sharing: heads
  sampling: proportional
  tasks:
    - name: en
      weight: 1.0
      data: {{corpora: [{{importer: folder, path: {corpus}, name: en-folder}}]}}
      paths: {{alphabet: auto}}
    - name: fr
      weight: 1.0
      data:
        train_files: [fr/train.csv]
        dev_files: [fr/dev.csv]
        test_files: [fr/test.csv]
        text: {{language: fr}}
      paths: {{alphabet: auto}}
      decoder: {{lm_corpus_files: [fr-text.txt]}}
    - name: en_phones
      weight: 0.3
      targets: phonemes
      of: en
      export: false
"""


def _issue_config(write_config, tmp_path, extra: str = ""):
    (tmp_path / "corpus").mkdir(exist_ok=True)
    return write_config(ISSUE_SHAPE.format(work=tmp_path / "work", corpus=tmp_path / "corpus") + extra)


def test_the_issue_shape_loads_and_each_task_reads_as_a_single_task_config(write_config, tmp_path):
    config = load_config(_issue_config(write_config, tmp_path))
    assert config.tasks == ("en", "fr", "en_phones")
    assert (config.multitask.sharing, config.multitask.sampling) == ("heads", "proportional")
    assert [t.weight for t in config.multitask.tasks] == [1.0, 1.0, 0.3]

    fr = config.task_view("fr")
    assert fr.task == "fr" and fr.source == config.source
    # paths are relative to the file that wrote them; a key the task does not give is the top-level one
    assert fr.data.train_files == (str(tmp_path / "fr" / "train.csv"),)
    assert fr.data.limit_train == 40 and fr.data.corpora == ()
    # a group of keys overrides only the keys it gives
    assert fr.data.text.language == "fr" and fr.data.text.case == "lower"
    assert fr.decoder.lm_corpus_files == (str(tmp_path / "fr-text.txt"),) and fr.decoder.lm_order == 3
    assert fr.alphabet_auto

    en = config.task_view("en")
    assert [c.key for c in en.data.corpora] == ["en-folder"] and en.data.train_files == ()
    assert en.data.text.language == ""

    phones = config.task_view("en_phones")
    assert phones.phonemes_of == "en" and en.phonemes_of is None
    assert phones.data.corpora == en.data.corpora  # the same audio as task en
    assert phones.data.text == PHONEME_TEXT and phones.alphabet_auto
    assert not config.multitask.task("en_phones").export

    # the resolved config saved beside a run writes the tasks as the file did
    tasks = config_to_dict(config)["multitask"]["tasks"]
    assert tasks[1]["data"]["text"] == {"language": "fr"} and tasks[1]["decoder"]["lm_corpus_files"] == [
        str(tmp_path / "fr-text.txt")
    ]
    assert tasks[2]["targets"] == "phonemes" and tasks[2]["of"] == "en"


def test_without_multitask_a_config_has_no_tasks():
    config = load_config(ROOT / "configs" / "sample.yaml")
    assert config.tasks == () and config.task == ""
    assert config_to_dict(config)["multitask"] == {
        "sharing": "heads",
        "sampling": "proportional",
        "tasks": [],
    }
    with pytest.raises(
        ConfigError, match=r"sample\.yaml: multitask\.tasks has no task 'fr'; its tasks: none"
    ):
        config.task_view("fr")


def _tasks(*entries: str, sharing: str = "heads", top: str = "") -> str:
    return (
        top
        + f"multitask:\n  sharing: {sharing}\n  tasks:\n"
        + "".join(f"    - {entry}\n" for entry in entries)
    )


EN = "{name: en, data: {train_files: [en.csv]}}"
FR = "{name: fr, data: {train_files: [fr.csv]}}"


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            _tasks(EN, "{name: fr, data: {train_file: [fr.csv]}}"),
            r"multitask\.tasks\[1\]\.data\.train_file: unknown key; did you mean 'train_files'\?",
        ),
        (
            _tasks(EN, "{name: fr, paths: {work_dir: w}}"),
            r"multitask\.tasks\[1\]\.paths\.work_dir: unknown key; .*expected one of export_dir, alphabet$",
        ),
        (
            _tasks(EN, "{name: fr, model: {n_hidden: 8}}"),
            r"multitask\.tasks\[1\]\.model\.n_hidden: unknown key; expected one of objective, output, tr",
        ),
        (
            _tasks(EN, "{name: fr, weight: 0}"),
            r"multitask\.tasks\[1\]\.weight: expected a value greater than 0",
        ),
        (_tasks(EN, "{weight: 2}"), r"multitask\.tasks\[1\]\.name: required, not given"),
        (_tasks(EN, "{name: en}"), r"multitask\.tasks\[1\]\.name: 'en' is also multitask\.tasks\[0\]'s name"),
        (_tasks(EN, "{name: fr/x}"), r"multitask\.tasks\[1\]\.name: 'fr/x' is not a task name"),
        (
            _tasks(EN, "{name: '2024'}"),
            r"multitask\.tasks\[1\]\.name: '2024' is not a task name .*not digits only",
        ),
        (
            _tasks(EN, "{name: ph, targets: phonemes}"),
            r"multitask\.tasks\[1\] \(ph\)\.of: targets: phonemes needs",
        ),
        (_tasks(EN, "{name: ph, targets: phonemes, of: de}"), r"\(ph\)\.of: 'de' is not another task"),
        (
            _tasks(EN, "{name: ph, targets: phonemes, of: en}", "{name: ph2, targets: phonemes, of: ph}"),
            r"\(ph2\)\.of: task 'ph' is itself a phonemes task",
        ),
        (
            _tasks(EN, "{name: ph, targets: phonemes, of: en, data: {train_files: [x.csv]}}"),
            r"\(ph\)\.data\.train_files: a phonemes task reads the audio and transcripts of task 'en'",
        ),
        (_tasks(EN, "{name: fr, of: en}"), r"\(fr\)\.of: only a task with targets: phonemes"),
        (
            _tasks(EN, "{name: fr, data: {train_files: [fr.csv]}, decoder: {lm_prune: [2, 1]}}"),
            r"config\.yaml: multitask\.tasks\[1\] \(fr\): decoder\.lm_prune: expected at most",
        ),
        (
            _tasks(
                EN, "{name: fr, data: {train_files: [fr.csv]}, paths: {alphabet: auto}}", sharing="shared"
            ),
            r"multitask\.sharing: shared has one output layer .* task en has the alphabet data/alphabet\.txt "
            r"\(default\) and task fr the alphabet auto",
        ),
        (
            _tasks(EN, FR, top="model: {architecture: tests.plugins.simple_rnn_family}\n"),
            r"multitask\.sharing: heads needs the tests\.plugins\.simple_rnn_family family's encoder",
        ),
        ("multitask:\n  sharing: shared\n", r"multitask\.tasks: no task given"),
        (
            _tasks(
                EN,
                "{name: fr, data: {train_files: [fr.csv]}, paths: {export_dir: models/en}}",
                top="paths: {export_dir: models}\n",
            ),
            r"multitask\.tasks\[1\] \(fr\)\.paths\.export_dir: \S*models/en is also the export directory "
            r"of task en; give each exported task its own",
        ),
        (
            _tasks(
                "{name: en, data: {train_files: [en.csv]}, paths: {export_dir: out}}",
                "{name: fr, data: {train_files: [fr.csv]}, paths: {export_dir: out}}",
            ),
            r"\(fr\)\.paths\.export_dir: \S*out is also the export directory of task en",
        ),
        (
            _tasks(EN, "{name: fr, data: {train_files: [fr.csv]}, decoder: {tune: true}}"),
            r"multitask\.tasks\[1\] \(fr\): decoder\.tune: TuneDecoder searches on the task's dev split "
            r"and it gives none",
        ),
        (
            _tasks(EN, "{name: fr, data: [fr.csv]}"),
            r"multitask\.tasks\[1\]\.data: expected a mapping of keys",
        ),
    ],
)
def test_bad_multitask_configs_fail_with_one_line_naming_the_task_and_key(write_config, body, expected):
    path = write_config(body)
    with pytest.raises(ConfigError, match=expected) as error:
        load_config(path)
    assert "\n" not in str(error.value) and path.name in str(error.value)


def test_shared_sharing_takes_tasks_with_one_alphabet(write_config):
    shared = "{name: %s, data: {train_files: [%s.csv]}, paths: {alphabet: auto}}"
    config = load_config(write_config(_tasks(shared % ("en", "en"), shared % ("fr", "fr"), sharing="shared")))
    assert [config.task_view(name).alphabet_auto for name in config.tasks] == [True, True]
    config = load_config(write_config(_tasks(EN, FR, sharing="separate")))
    assert config.multitask.sharing == "separate"


def test_a_child_config_replaces_the_task_list(write_config, tmp_path):
    write_config(_tasks(EN, FR), name="base.yaml")
    child = write_config(
        "extends: base.yaml\nmultitask:\n  tasks:\n    - {name: de, data: {train_files: [de.csv]}}\n"
    )
    config = load_config(child)
    assert config.tasks == ("de",) and config.multitask.sharing == "heads"


def test_averaging_is_taken_with_tasks_and_best_needs_one_task_that_validates():
    """export.average with multitask: last anyway; best when one task has a dev split (the run ranks its
    checkpoints by the tasks' weighted mean, of the tasks validated), refused in one line when none has."""
    from pipeline.config_loader import config_from_dict
    from pipeline.dag import upstream

    dev = str(ROOT / "data" / "sample" / "dev.csv")
    tasks = [{"name": "en", "data": {"dev_files": [dev]}}, {"name": "fr"}]
    last = config_from_dict({"multitask": {"tasks": tasks}, "export": {"average": {"last": 2}}})
    assert last.task_view("fr").export.average.last == 2
    best = config_from_dict(
        {"data": {"dev_files": []}, "multitask": {"tasks": tasks}, "export": {"average": {"best": 2}}}
    )
    assert [best.task_view(task).has_split("dev") for task in best.tasks] == [True, False]
    # Evaluate of a task reads its own dev split for the average's dev figures, when it has one
    assert ("features", {"split": "dev", "task": "en"}) in upstream(best, "evaluate", {"task": "en"})
    assert not any(node[1].get("split") == "dev" for node in upstream(best, "evaluate", {"task": "fr"}))
    plain = [{"name": "en"}, {"name": "fr"}]
    for unvalidated in (
        {"data": {"dev_files": []}, "multitask": {"tasks": plain}},  # no task has a dev split
        {"training": {"validation_epochs": 0}, "multitask": {"tasks": tasks}},
    ):
        with pytest.raises(ConfigError) as error:
            config_from_dict({**unvalidated, "export": {"average": {"best": 2}}})
        message = str(error.value)
        assert "export.average.best ranks checkpoints by their validation" in message, message
        assert "no task has a dev split" in message and "\n" not in message
