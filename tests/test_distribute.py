import json

import pytest

from pipeline.config import DistributionConfig
from pipeline.train.distribute import ClusterRole, DistributionError, cluster_role, make_strategy


def test_cluster_role_from_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster_role() == ClusterRole(0, 1) and cluster_role().is_chief
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 1}}
        ),
    )
    role = cluster_role()
    assert role == ClusterRole(1, 2) and not role.is_chief


@pytest.mark.parametrize(
    "raw, message",
    [
        ("not json", "TF_CONFIG: expected"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), "TF_CONFIG: expected"),
        (
            json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}),
            "task type 'ps' is not supported",
        ),
    ],
)
def test_bad_tf_config_is_explained(monkeypatch, raw, message):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(DistributionError, match=message):
        cluster_role()


def test_multi_worker_needs_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(DistributionError, match="needs the TF_CONFIG environment variable"):
        make_strategy(DistributionConfig(strategy="multi_worker"))


def test_one_device_strategy_has_one_replica():
    assert make_strategy(DistributionConfig(strategy="one_device")).num_replicas_in_sync == 1
    assert make_strategy(DistributionConfig(strategy="auto")).num_replicas_in_sync == 1
