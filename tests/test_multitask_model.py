"""The model of a multi-task config (``pipeline/model/heads.py``): its heads or networks, their names in the
checkpoint, a task's single-task model read back from it, and warm starts from a single-task run."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from pipeline.config_loader import config_from_dict
from pipeline.model import build_model, model_family
from pipeline.model.checkpoints import CheckpointMismatchError, load_trained_model, warm_start
from pipeline.model.heads import MultiTaskModel
from pipeline.model.weights import named_weights, rng_states

N_INPUT, CLASSES = 13, (29, 35)


def _config(sharing: str, architecture: str = "deepspeech"):
    model = {"architecture": architecture, "n_hidden": 12, "n_context": 1, "dropout_rate": 0.0}
    if architecture == "conformer":
        model = {"architecture": architecture}
        model["conformer"] = {
            "d_model": 16,
            "layers": 1,
            "heads": 2,
            "conv_kernel": 3,
            "subsampling_channels": 4,
        }
    tasks = [
        {"name": "en", "data": {"train_files": ["en.csv"]}},
        {"name": "fr", "data": {"train_files": ["fr.csv"]}, "paths": {"alphabet": "auto"}},
    ]
    if sharing == "shared":
        for task in tasks:
            task["paths"] = {"alphabet": "auto"}
    return config_from_dict({"model": model, "multitask": {"sharing": sharing, "tasks": tasks}})


def _save(model, path) -> str:
    return tf.train.Checkpoint(weights=named_weights(model)).write(str(path))


@pytest.mark.parametrize("architecture", ["deepspeech", "conformer"])
def test_heads_share_the_encoder_and_each_task_reads_back_as_a_single_task_model(tmp_path, architecture):
    config = _config("heads", architecture)
    model = MultiTaskModel(config.model, "heads", ("en", "fr"), N_INPUT, CLASSES)
    names = set(model.named_weights())
    output = "layer_6" if architecture == "deepspeech" else "output"
    assert {"heads.en.kernel", "heads.en.bias", "heads.fr.kernel", "heads.fr.bias"} <= names
    assert not any(name.startswith(f"{output}.") for name in names)
    assert model.named_weights()["heads.fr.kernel"].shape[-1] == 35
    encoder = [v for v in model.task_variables([0]) if all(v is not h for h in model.head(0).weights)]
    assert {id(v) for v in model.task_variables([1])} == {id(v) for v in encoder} | {
        id(v) for v in model.head(1).trainable_variables
    }
    features = tf.random.stateless_normal([1, 24, N_INPUT], seed=[1, 2])
    lengths = tf.constant([24])
    prefix = _save(model, tmp_path / "multi")
    for index, task in enumerate(("en", "fr")):
        view = config.task_view(task)
        alone = load_trained_model(view, prefix, N_INPUT, CLASSES[index])
        expected = model.forward(index, features, lengths, training=False)[0]
        # the family's forward: the Conformer's inference is chunked, as the task's head computes it
        single = model_family(architecture).forward(alone, features, lengths, training=False)[0]
        np.testing.assert_allclose(single.numpy(), expected.numpy(), atol=1e-5)


def test_separate_networks_are_named_per_task_and_shared_is_one_network(tmp_path):
    separate = MultiTaskModel(_config("separate").model, "separate", ("en", "fr"), N_INPUT, CLASSES)
    names = set(separate.named_weights())
    assert {"tasks.en.layer_1.kernel", "tasks.fr.layer_6.kernel"} <= names
    per_network = len(rng_states(separate.networks[0]))
    assert per_network >= 1  # the dropouts' random state, named by task and position
    assert set(separate.rng_states()) == {f"tasks.{t}.{i}" for t in ("en", "fr") for i in range(per_network)}
    prefix = _save(separate, tmp_path / "separate")
    config = _config("separate")
    alone = load_trained_model(config.task_view("fr"), prefix, N_INPUT, CLASSES[1])
    np.testing.assert_array_equal(
        named_weights(alone)["layer_1.kernel"].numpy(),
        separate.named_weights()["tasks.fr.layer_1.kernel"].numpy(),
    )
    shared = MultiTaskModel(_config("shared").model, "shared", ("en", "fr"), N_INPUT, (29, 29))
    assert set(shared.named_weights()) == set(
        named_weights(build_model(_config("shared").model, N_INPUT, 29))
    )
    with pytest.raises(ValueError, match="shared needs one set of labels"):
        MultiTaskModel(_config("shared").model, "shared", ("en", "fr"), N_INPUT, CLASSES)


def test_a_multi_task_run_warm_starts_from_a_single_task_run(tmp_path):
    """training.init_from of a single-task (English) run: the encoder is copied; with
    drop_source_layers: 1 every head starts fresh, without it a head whose labels differ is named."""
    config = _config("heads")
    source = build_model(config.model, N_INPUT, 29)
    prefix = _save(source, tmp_path / "english")
    model = MultiTaskModel(config.model, "heads", ("en", "fr"), N_INPUT, CLASSES)
    fresh = model.named_weights()["heads.fr.kernel"].numpy().copy()
    copied = warm_start(model, prefix, 1)
    assert "layer_1.kernel" in copied and not any(name.startswith("heads.") for name in copied)
    np.testing.assert_array_equal(
        model.named_weights()["lstm.lstm_cell.kernel"].numpy(),
        named_weights(source)["lstm.lstm_cell.kernel"].numpy(),
    )
    np.testing.assert_array_equal(model.named_weights()["heads.fr.kernel"].numpy(), fresh)
    with pytest.raises(CheckpointMismatchError, match=r"weight heads\.fr\.kernel has shape \[12, 29\]"):
        warm_start(model, prefix, 0)


@pytest.mark.parametrize("sharing", ["heads", "separate"])
def test_a_dotted_task_name_warm_starts_from_a_single_task_run(tmp_path, sharing):
    """A task name may hold dots (``fr.ca``): its head (or network) still reads as the single-task model's
    output layer (or network), so training.init_from of a single-task run copies into it and
    drop_source_layers drops its output layer."""
    config = _config(sharing)
    source = build_model(config.model, N_INPUT, 29)
    prefix = _save(source, tmp_path / "english")
    model = MultiTaskModel(config.model, sharing, ("en", "fr.ca"), N_INPUT, (29, 29))
    copied = warm_start(model, prefix, 0)
    assert set(copied) == set(model.named_weights())
    for name, variable in model.named_weights().items():
        np.testing.assert_array_equal(
            variable.numpy(), named_weights(source)[model.single_task_name(name)].numpy()
        )
    other = MultiTaskModel(config.model, sharing, ("en", "fr.ca"), N_INPUT, CLASSES)
    kept = warm_start(other, prefix, 1)  # the output layers start fresh, whatever the task's name
    assert not any(name.endswith(("layer_6.kernel", "heads.fr.ca.kernel")) for name in kept)
    assert any(name.endswith("layer_5.kernel") for name in kept)
