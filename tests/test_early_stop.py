import pytest

from pipeline.config import EarlyStopConfig
from pipeline.train.early_stop import patience_rule, seed_rule, should_stop


def test_seed_rule_needs_enough_losses():
    config = EarlyStopConfig(rule="seed", earlystop_nsteps=4)
    decision = seed_rule([10.0, 9.0, 8.0], config)
    assert not decision.stop and "3 of 4" in decision.reason


def test_seed_rule_stops_when_latest_exceeds_previous_max():
    config = EarlyStopConfig(rule="seed", earlystop_nsteps=4, estop_mean_thresh=0.5, estop_std_thresh=0.5)
    decision = seed_rule([30.0, 20.0, 10.0, 31.0], config)
    assert decision.stop and "above the max 30.0000" in decision.reason


def test_seed_rule_stops_on_a_plateau():
    config = EarlyStopConfig(rule="seed", earlystop_nsteps=4, estop_mean_thresh=0.5, estop_std_thresh=0.5)
    decision = seed_rule([12.1, 12.0, 11.9, 11.8], config)
    assert decision.stop and "std" in decision.reason


def test_seed_rule_keeps_going_while_improving():
    config = EarlyStopConfig(rule="seed", earlystop_nsteps=4, estop_mean_thresh=0.5, estop_std_thresh=0.5)
    assert not seed_rule([40.0, 30.0, 20.0, 10.0], config).stop
    # only the last earlystop_nsteps values count
    assert not seed_rule([1.0, 40.0, 30.0, 20.0, 10.0], config).stop


def test_patience_rule():
    config = EarlyStopConfig(rule="patience", es_epochs=2, es_min_delta=0.1)
    assert not patience_rule([5.0, 4.0], config).stop
    assert not patience_rule([5.0, 4.0, 3.0, 2.5], config).stop
    decision = patience_rule([5.0, 4.0, 3.95, 4.2], config)
    assert decision.stop and "last 2 validations" in decision.reason


def test_off_never_stops_even_on_bad_losses():
    assert should_stop([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], EarlyStopConfig(rule="off")) is None
    assert should_stop([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], EarlyStopConfig(rule="seed")).stop


def test_warm_up_raises_the_rate_linearly_then_decay_and_plateau_factor_apply():
    from pipeline.config import TrainingConfig
    from pipeline.train.policy import learning_rate

    warm = TrainingConfig(learning_rate=0.002, warmup_steps=4)
    assert [learning_rate(warm, 1.0, step) for step in range(6)] == pytest.approx(
        [0.0005, 0.001, 0.0015, 0.002, 0.002, 0.002]
    )
    assert learning_rate(warm, 0.5, 1) == pytest.approx(0.0005)  # the plateau halving multiplies in
    decayed = TrainingConfig(
        learning_rate=0.002, warmup_steps=4, lr_decay="exponential", decay_steps=4, decay_rate=0.5
    )
    assert learning_rate(decayed, 1.0, 8) == pytest.approx(0.0005)
    assert learning_rate(TrainingConfig(learning_rate=0.002), 1.0, 0) == 0.002  # no warm-up by default
