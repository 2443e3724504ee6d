"""Extension points: a front end and a model family of a user's own (tests/plugins/), and the built-in
logfbank front end, each through the DAG and the client without editing a project file."""

from __future__ import annotations

import json

import luigi
import numpy as np
import pytest

from native_client import Model
from native_client.audio import load_for_model
from pipeline.config_loader import load_config
from pipeline.layout import Layout
from pipeline.model.checkpoints import load_trained_model
from tasks import Evaluate, Export
from tests.conftest import SAMPLE

pytestmark = pytest.mark.usefixtures("tasks_in_process")
CLIP = SAMPLE / "test" / "00002.flac"


def _client_logits_equal_the_checkpoint(config, export):
    """The client (its front end chosen from the export's metadata) gives the checkpoint's logits."""
    model = Model(export)
    samples = load_for_model(CLIP, 16000)
    frames = model.metadata.features.frames(samples)
    checkpoint = load_trained_model(config, Layout(config).train_run.best, frames.shape[1], 29)
    np.testing.assert_allclose(model.logits(samples), checkpoint(frames[None]).numpy()[0], atol=1e-4)
    assert isinstance(model.transcribe_file(CLIP).text, str)
    return model


def test_a_front_end_and_a_model_family_of_ones_own_run_through_the_dag_and_the_client(small_config):
    path = small_config(
        limit_train=12,
        limit_dev=4,
        limit_test=4,
        extra="""
            features:
              type: tests.plugins.band_energies
              bands: 10
              step_ms: 20
            model:
              architecture: tests.plugins.simple_rnn_family
              options: {units: 24}
            training:
              epochs: 1
        """,
    )
    assert luigi.build([Export(config=str(path))], local_scheduler=True)
    config = load_config(path)
    export = Layout(config).find_export().root
    metadata = json.loads((export / "metadata.json").read_text())
    assert metadata["architecture"] == "tests.plugins.simple_rnn_family"
    assert metadata["features"] == {"type": "tests.plugins.band_energies", "bands": 10, "window_ms": 25.0, "step_ms": 20.0,
                                    "sample_rate": 16000, "normalize": True}
    assert metadata["tensors"]["state"] == [{"input": "previous_state", "output": "new_state", "shape": [1, 24]}]
    model = _client_logits_equal_the_checkpoint(config, export)
    assert model.metadata.features.frontend.feature_size == 10
    assert model.metadata.features.seconds_per_frame == pytest.approx(0.02)


def test_a_front_end_of_ones_own_must_be_a_front_end(small_config):
    from pipeline.config import ConfigError

    path = small_config(extra="features:\n  type: tests.plugins.simple_rnn_family\n")
    with pytest.raises(ConfigError, match=r"features\.type: module 'tests\.plugins\.simple_rnn_family' defines no FRONTEND"):
        load_config(path)


def test_logfbank_trains_through_the_whole_dag_and_the_client_uses_it(small_config):
    path = small_config(
        limit_train=12,
        limit_dev=4,
        limit_test=4,
        extra="features:\n  type: logfbank\n  nfilt: 30\ntraining:\n  epochs: 1\n",
    )
    assert luigi.build([Evaluate(config=str(path)), Export(config=str(path))], local_scheduler=True)
    config = load_config(path)
    features_file = Layout(config).features_cache("train")
    mfcc = Layout(load_config(small_config("mfcc.yaml", limit_train=12, limit_dev=4, limit_test=4)))
    assert features_file != mfcc.features_cache("train")  # another front end, another cache
    export = Layout(config).find_export().root
    model = _client_logits_equal_the_checkpoint(config, export)
    assert model.metadata.features.to_dict()["type"] == "logfbank"
    assert model.metadata.features.frontend.feature_size == 30
