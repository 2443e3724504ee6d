import json

import pytest

from pipeline.config import DistributionConfig
from pipeline.train.distribute import (
    ClusterRole,
    DistributionError,
    cluster_role,
    make_strategy,
    training_role,
)


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


def _tf_config(cluster: dict, kind: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def test_a_chief_task_is_the_only_chief(monkeypatch):
    """Issue 26 M5: with a ``chief`` job, worker 0 is not a second chief."""
    cluster = {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"]}
    roles = {}
    for kind, index in (("chief", 0), ("worker", 0), ("worker", 1)):
        monkeypatch.setenv("TF_CONFIG", _tf_config(cluster, kind, index))
        roles[kind, index] = cluster_role()
    assert [role.is_chief for role in roles.values()] == [True, False, False]
    assert {role.index for role in roles.values()} == {0, 1, 2}  # distinct ranks (scratch folders, logs)
    assert {role.count for role in roles.values()} == {3}


@pytest.mark.parametrize(
    "cluster, kind, index, message",
    [
        ({"worker": ["a:1"]}, "worker", 1, "task worker 1 is not in the cluster"),
        ({"chief": ["a:1", "b:1"], "worker": []}, "chief", 0, "2 chief tasks"),
        ({"worker": ["a:1"]}, "chief", 0, "task chief 0 is not in the cluster"),
    ],
)
def test_a_task_outside_the_cluster_is_explained(monkeypatch, cluster, kind, index, message):
    monkeypatch.setenv("TF_CONFIG", _tf_config(cluster, kind, index))
    with pytest.raises(DistributionError, match=message):
        cluster_role()


def test_tf_config_gives_a_role_only_to_multi_worker_training(monkeypatch, caplog):
    """Issue 26 H3: a leftover TF_CONFIG naming worker 1 must not make a single-process run a non-chief."""
    monkeypatch.setenv("TF_CONFIG", _tf_config({"worker": ["h:1", "h:2"]}, "worker", 1))
    with caplog.at_level("WARNING"):
        role = training_role(DistributionConfig(strategy="auto"))
    assert role == ClusterRole(0, 1) and role.is_chief
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "TF_CONFIG is ignored" in warnings[0] and "\n" not in warnings[0]
    assert training_role(DistributionConfig(strategy="multi_worker")) == ClusterRole(1, 2)
    monkeypatch.delenv("TF_CONFIG")
    caplog.clear()
    assert training_role(DistributionConfig(strategy="mirrored")) == ClusterRole(0, 1) and not caplog.records
