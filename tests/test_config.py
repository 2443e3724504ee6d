import subprocess
import sys

import pytest

from pipeline.config import ConfigError
from pipeline.config_loader import config_to_dict, documented_keys, load_config
from pipeline.layout import Layout
from tests.conftest import ROOT


def test_sample_and_en_configs_load():
    sample = load_config(ROOT / "configs" / "sample.yaml")
    assert sample.data.train_files == (str(ROOT / "data" / "sample" / "train.csv"),)
    en = load_config(ROOT / "configs" / "en.yaml")
    assert en.model.options.n_hidden == 2048 and en.model.options.n_context == 9 and en.features.numcep == 26
    assert en.training.learning_rate == 0.001 and en.decoder.beam_width == 1024


def test_extends_overrides_a_subset_and_resolves_paths_per_file(write_config, tmp_path):
    (tmp_path / "sub").mkdir()
    base = write_config(
        """
        data:
          train_files: [corpus/train.csv]
        model:
          n_hidden: 128
          relu_clip: 10
    """,
        "base.yaml",
    )
    child = write_config(
        """
        extends: ../base.yaml
        model:
          n_hidden: 64
        data:
          dev_files: dev.csv
    """,
        "sub/child.yaml",
    )
    config = load_config(child)
    assert config.model.options.n_hidden == 64
    assert config.model.options.relu_clip == 10.0
    assert config.data.train_files == (str(tmp_path / "corpus" / "train.csv"),)
    assert config.data.dev_files == (str(tmp_path / "sub" / "dev.csv"),)
    assert base.exists()


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            "model:\n  n_hiden: 5\n",
            r"model\.n_hiden: unknown key; did you mean 'n_hidden'\? "
            r"expected one of architecture, objective, random_seed, output, transducer, n_hidden",
        ),
        ("modle:\n  n_hidden: 5\n", r"unknown section 'modle'"),
        ("model:\n  n_hidden: many\n", r"model\.n_hidden: expected an integer, got 'many'"),
        ("model:\n  n_hidden: 0\n", r"model\.n_hidden: expected a value at least 1, got 0"),
        ("model:\n  dropout_rate: 1.5\n", r"model\.dropout_rate: expected a value at most 0\.99"),
        ("training:\n  learning_rate: 0\n", r"training\.learning_rate: expected a value greater than 0"),
        ("early_stop:\n  rule: sometimes\n", r"early_stop\.rule: expected one of 'seed', 'patience', 'off'"),
        ("features:\n  resample: yes please\n", r"features\.resample: expected true or false"),
        ("data:\n  train_files: 5\n", r"data\.train_files: expected a list of strings"),
        ("features:\n  numcep: 40\n", r"features\.numcep: expected at most nfilt \(26\)"),
        ("training:\n  epochs: 0\n", r"training\.epochs: expected a non-zero integer"),
        ("training:\n  lr_decay: noam\n", r"training\.lr_decay: noam peaks at learning_rate after"),
        (
            "training:\n  lr_decay: cosine\n  min_learning_rate: 0.001\n",
            r"training\.min_learning_rate: the cosine schedule falls from learning_rate \(0\.001\)",
        ),
        ("training:\n  bucket_growth: 1\n", r"training\.bucket_growth: the grid's growth a step, above 1"),
        ("training:\n  bucket_growth: 3\n", r"training\.bucket_growth: .*got 3$"),
        ("model: [1, 2\n", r"invalid YAML"),
        (
            "model:\n  n_hidden: 5\nmodel:\n  relu_clip: 3\n",
            r"config\.yaml:3: invalid YAML: duplicate key 'model'",
        ),
        ("extends: nowhere.yaml\n", r"extends: file .*nowhere\.yaml does not exist"),
    ],
)
def test_bad_configs_fail_with_one_line_naming_file_and_key(write_config, body, expected):
    path = write_config(body)
    with pytest.raises(ConfigError, match=expected) as error:
        load_config(path)
    message = str(error.value)
    assert "\n" not in message
    assert str(path.name) in message


def test_extends_of_a_directory_names_the_file_that_says_it(write_config, tmp_path):
    """Issue 26 N10: ``extends: <directory>`` named only the directory ("Is a directory")."""
    (tmp_path / "configs").mkdir()
    path = write_config("extends: configs\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    expected = f"{path}: extends: {tmp_path / 'configs'} is a directory; expected a YAML config file"
    assert str(error.value) == expected


def test_yaml_anchors_and_merge_keys_work(write_config):
    """Issue 26 N10: YAML's merge key failed with "could not determine a constructor for the tag merge"."""
    path = write_config("""
        x-common: &common
          batch_size: 3
          epochs: 2
        training:
          <<: *common
          epochs: 5
        model:
          n_hidden: 10
          n_hidden: 11
    """)
    with pytest.raises(ConfigError, match=r"duplicate key 'n_hidden'"):  # own keys must still be unique
        load_config(path)
    path.write_text(path.read_text().replace("  n_hidden: 11\n", ""))
    training = load_config(path).training
    assert (training.batch_size, training.epochs) == (3, 5)


def test_extends_cycle_is_reported(write_config):
    write_config("extends: b.yaml\n", "a.yaml")
    b = write_config("extends: a.yaml\n", "b.yaml")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(b)


def test_misspelt_key_fails_fast_from_the_command_line(write_config):
    """Fast by what it does, not by a clock: the error comes before TensorFlow (seconds to load) is
    imported."""
    path = write_config("training:\n  epoch: 3\n")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pipeline.config_loader import load_config, ConfigError\n"
            "try:\n    load_config(sys.argv[1])\nexcept ConfigError as e:\n"
            "    print(e, 'tensorflow' in sys.modules); sys.exit(2)",
            str(path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stdout.strip().count("\n") == 0
    assert "training.epoch: unknown key" in result.stdout and str(path) in result.stdout
    assert result.stdout.strip().endswith(" False"), result.stdout  # TensorFlow was never loaded


def test_fingerprints_move_only_the_stages_that_depend_on_a_setting(write_config):
    base = "extends: {}\n".format(ROOT / "configs" / "sample.yaml")
    a = load_config(write_config(base, "a.yaml"))
    hidden = load_config(write_config(base + "model:\n  n_hidden: 99\n", "b.yaml"))
    numcep = load_config(write_config(base + "features:\n  numcep: 13\n", "c.yaml"))
    workers = load_config(write_config(base + "features:\n  workers: 1\n", "d.yaml"))
    epochs = load_config(write_config(base + "training:\n  epochs: 7\n", "e.yaml"))

    assert Layout(a).features_fingerprint("train") == Layout(hidden).features_fingerprint("train")
    assert Layout(a).train_fingerprint != Layout(hidden).train_fingerprint
    assert Layout(a).evaluate_fingerprint != Layout(hidden).evaluate_fingerprint

    assert Layout(a).features_fingerprint("train") != Layout(numcep).features_fingerprint("train")
    assert Layout(a).train_fingerprint != Layout(numcep).train_fingerprint

    assert Layout(a).features_fingerprint("train") == Layout(workers).features_fingerprint("train")
    assert Layout(a).train_fingerprint == Layout(workers).train_fingerprint

    # More epochs continue the same Train run, but Evaluate must be redone.
    assert Layout(a).train_fingerprint == Layout(epochs).train_fingerprint
    assert Layout(a).evaluate_fingerprint != Layout(epochs).evaluate_fingerprint

    assert Layout(a).features_fingerprint("train") != Layout(a).features_fingerprint("dev")


def test_work_dir_defaults_to_xdg_data_home(write_config, monkeypatch, tmp_path):
    config = load_config(write_config("model:\n  n_hidden: 8\n"))
    assert Layout(config).work_dir.name == "luigi-deepspeech"
    assert Layout(config).export_root == Layout(config).work_dir / "export"
    config = load_config(write_config("paths:\n  work_dir: out\n"))
    assert Layout(config).work_dir == tmp_path / "out"


def test_every_key_is_documented_in_the_configuration_reference():
    reference = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    for section, key, _default, doc in documented_keys():
        assert doc, f"{section}.{key} has no docstring"
        assert f"`{section}.{key}`" in reference, (
            f"docs/CONFIGURATION.md lacks {section}.{key}: run `make docs`"
        )


def test_config_round_trips_through_dict(write_config):
    """What Train writes as its run's config.yaml (and multi-worker workers load) loads as the same config,
    for DeepSpeech and for the Conformer (whose section leaves out DeepSpeech's keys)."""
    import yaml

    for name in ("sample.yaml", "sample-conformer.yaml"):
        config = load_config(ROOT / "configs" / name)
        plain = config_to_dict(config)
        assert plain["data"]["train_files"] == list(config.data.train_files)
        again = load_config(write_config(yaml.safe_dump(plain), f"again-{name}"))
        assert Layout(again).train_fingerprint == Layout(config).train_fingerprint
        assert again.model.options == config.model.options and again.data == config.data
    assert plain["model"]["conformer"]["d_model"] == 144 and "n_hidden" not in plain["model"]
    assert (
        config_to_dict(load_config(ROOT / "configs" / "sample.yaml"))["model"]["deepspeech"]["n_hidden"]
        == 384
    )
    dotted = write_config(
        "model:\n  architecture: pipeline.model.deepspeech\n  n_hidden: 96\n", "dotted.yaml"
    )
    assert (
        config_to_dict(load_config(dotted))["model"]["deepspeech"]["n_hidden"] == 96
    )  # DeepSpeech by its module's name


def _choice_keys_spelled_as_yaml_booleans() -> list[tuple[str, str, str]]:
    """(section, key, choice) of every choice-typed key of the schema with a choice YAML 1.1 reads as a
    boolean (off, no, on, yes, ...)."""
    import dataclasses
    import typing

    from pipeline.config import Config

    words = {"on", "off", "yes", "no", "true", "false"}  # YAML 1.1's booleans (PyYAML reads them so)
    found = []
    for section in dataclasses.fields(Config):
        if section.name == "source":
            continue
        hints = typing.get_type_hints(typing.get_type_hints(Config)[section.name])
        for name, tp in hints.items():
            if typing.get_origin(tp) is typing.Literal:
                # string choices only: a boolean choice (features.normalize: true) is the boolean YAML reads
                found += [
                    (section.name, name, c)
                    for c in typing.get_args(tp)
                    if isinstance(c, str) and c.lower() in words
                ]
    return found


def test_the_schema_has_choices_spelled_as_yaml_booleans():
    assert ("early_stop", "rule", "off") in _choice_keys_spelled_as_yaml_booleans()


@pytest.mark.parametrize("section, key, choice", _choice_keys_spelled_as_yaml_booleans())
def test_a_choice_written_as_yaml_reads_it(write_config, section, key, choice):
    """``early_stop: {rule: off}`` as the configuration reference writes it: YAML 1.1 reads ``off`` as
    false; the loader reads it as the choice it spells, in every spelling YAML gives that boolean."""
    for written in (choice, choice.upper(), choice.capitalize()):
        config = load_config(write_config(f"{section}:\n  {key}: {written}\n"))
        assert getattr(getattr(config, section), key) == choice


def test_a_yaml_boolean_is_still_refused_where_no_choice_spells_it(write_config):
    with pytest.raises(ConfigError, match=r"model\.output: expected one of 'characters', 'bytes', got False"):
        load_config(write_config("model:\n  output: off\n"))


def test_deepspeech_keys_in_a_config_of_another_family_are_one_line_naming_it(write_config):
    """``model.n_hidden`` where the family is the Conformer was accepted and never read, and the model
    section answered ``model.n_hidden`` and ``model.d_model`` alike. Now a file (or an override) that sets
    a DeepSpeech key where its family is another is refused naming the key and the family; a DeepSpeech
    base's keys under a child that chooses another family are left unread; and the family's settings are
    read where they are, ``model.options``."""
    conformer = "model:\n  architecture: conformer\n  conformer: {d_model: 64, heads: 4}\n"
    same_file = write_config(conformer + "  n_hidden: 128\n", "same.yaml")
    with pytest.raises(ConfigError) as error:
        load_config(same_file)
    assert str(error.value) == (
        f"{same_file}: model.n_hidden: a setting of the deepspeech family, in a config of the conformer "
        "family, which does not read it (a family's own settings go under model.conformer:)"
    )
    base = write_config(conformer, "base.yaml")
    child = write_config("extends: base.yaml\nmodel:\n  dropout_rate: 0.2\n", "child.yaml")
    with pytest.raises(ConfigError, match=rf"^{child}: model\.dropout_rate: a setting of the deepspeech"):
        load_config(child)
    with pytest.raises(ConfigError, match=r"\(overrides\): model\.lstm_kernel: a setting of the deepspeech"):
        load_config(base, {"model": {"lstm_kernel": "fused"}})
    write_config("model:\n  n_hidden: 128\n", "deepspeech.yaml")
    over = load_config(write_config("extends: deepspeech.yaml\n" + conformer, "over.yaml"))
    assert over.model.architecture == "conformer" and over.model.options.d_model == 64
    assert not hasattr(over.model, "d_model")
    alone = load_config(write_config(conformer, "alone.yaml"))  # the base's key is neither read nor hashed
    assert Layout(over).train_fingerprint == Layout(alone).train_fingerprint


def test_deepspeech_settings_are_typed_and_either_spelling_merges_as_one(write_config):
    """DeepSpeech's settings are its family's ``Settings`` under ``model.deepspeech:`` like every family's;
    the model section has no ``n_hidden`` of its own to answer. DeepSpeech's own spelling (the section's
    keys) is read file by file before ``extends:`` merges, so either spelling over the other merges as one
    (the later file wins) and hashes as one; both spellings in one file are one line naming both."""
    from pipeline.model.deepspeech import DeepSpeechSettings

    new = write_config("model:\n  deepspeech:\n    n_hidden: 64\n    relu_clip: 10.0\n", "new.yaml")
    old = write_config("model:\n  n_hidden: 64\n  relu_clip: 10.0\n", "old.yaml")
    read = load_config(new)
    assert read.model.options == DeepSpeechSettings(n_hidden=64, relu_clip=10.0)
    assert not hasattr(read.model, "n_hidden")
    assert Layout(load_config(old)).train_fingerprint == Layout(read).train_fingerprint
    old_over_new = load_config(write_config("extends: new.yaml\nmodel:\n  n_hidden: 32\n", "a.yaml"))
    new_over_old = load_config(
        write_config("extends: old.yaml\nmodel:\n  deepspeech: {n_hidden: 32}\n", "b.yaml")
    )
    for merged in (old_over_new, new_over_old):
        assert merged.model.options == DeepSpeechSettings(n_hidden=32, relu_clip=10.0)
    assert config_to_dict(old_over_new)["model"]["deepspeech"]["n_hidden"] == 32
    both = write_config("model:\n  n_hidden: 64\n  deepspeech: {n_hidden: 32}\n", "both.yaml")
    with pytest.raises(ConfigError) as error:
        load_config(both)
    assert str(error.value) == (
        f"{both}: model.n_hidden and model.deepspeech.n_hidden: one setting given twice in one file; keep one"
    )
    zero = write_config("model:\n  n_hidden: 0\n", "zero.yaml")  # a range error names the key as written
    with pytest.raises(ConfigError, match=rf"^{zero}: model\.n_hidden: expected a value at least 1, got 0$"):
        load_config(zero)
    with pytest.raises(
        ConfigError, match=r"\(overrides\): model\.deepspeech\.n_hidden: expected a value at least 1"
    ):
        load_config(new, {"model": {"deepspeech": {"n_hidden": 0}}})


def test_a_deepspeech_block_is_read_by_the_module_name_and_may_be_empty(write_config):
    """A review found ``model: {pipeline.model.deepspeech: {n_hidden: 512}}`` silently ignored, and an
    empty ``model.deepspeech:`` (every key commented out: YAML's null) called an unknown key."""
    dotted = (
        "model:\n  architecture: pipeline.model.deepspeech\n  pipeline.model.deepspeech: {n_hidden: 512}\n"
    )
    assert load_config(write_config(dotted, "dotted.yaml")).model.options.n_hidden == 512
    by_module = write_config("model:\n  pipeline.model.deepspeech: {n_hidden: 256}\n", "module.yaml")
    assert load_config(by_module).model.options.n_hidden == 256
    empty = load_config(write_config("model:\n  deepspeech:\n  # n_hidden: 64\n", "empty.yaml"))
    assert empty.model.options.n_hidden == 2048
    number = write_config("model:\n  deepspeech: 5\n", "number.yaml")
    with pytest.raises(ConfigError) as error:
        load_config(number)
    assert (
        str(error.value)
        == f"{number}: model.deepspeech: expected a mapping of the deepspeech family's settings"
    )


def test_every_spelling_of_a_deepspeech_setting_merges_as_one_and_non_families_stay_unknown(write_config):
    """A second review found the module-name block kept apart from ``deepspeech:``, so a base file's
    setting there beat a child's; one file giving a key in both went unrefused; and ``model.heads: 5`` (a
    module of pipeline/model that is no family) called a family block. Now every spelling is one block."""
    write_config(
        "model:\n  deepspeech: {dropout_rate: 0.1}\n  pipeline.model.deepspeech: {n_hidden: 2048}\n",
        "base.yaml",
    )
    child = load_config(write_config("extends: base.yaml\nmodel:\n  n_hidden: 512\n", "child.yaml"))
    assert child.model.options.n_hidden == 512 and child.model.options.dropout_rate == 0.1
    both = write_config(
        "model:\n  n_hidden: 512\n  pipeline.model.deepspeech: {n_hidden: 1024}\n", "both.yaml"
    )
    with pytest.raises(ConfigError) as error:
        load_config(both)
    assert str(error.value) == (
        f"{both}: model.n_hidden and model.pipeline.model.deepspeech.n_hidden: one setting given twice in "
        "one file; keep one"
    )
    for body in ("model:\n  heads: 5\n", "model:\n  objectives: ctc\n", "model:\n  heads:\n"):
        with pytest.raises(ConfigError, match=r"model\.(heads|objectives): unknown key"):
            load_config(write_config(body, "other.yaml"))
