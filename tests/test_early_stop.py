import math

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


def test_noam_and_cosine_follow_their_formulas_after_the_warm_up_and_the_plateau_factor_multiplies_in():
    from pipeline.config import TrainingConfig
    from pipeline.train.policy import learning_rate

    noam = TrainingConfig(learning_rate=0.002, warmup_steps=4, lr_decay="noam")
    # ESPnet's and WeNet's: lr x warmup^0.5 x min(u^-0.5, u x warmup^-1.5), u the update counted from 1
    for updates in range(40):
        u = updates + 1
        assert learning_rate(noam, 1.0, updates) == pytest.approx(0.002 * 4**0.5 * min(u**-0.5, u * 4**-1.5))
    assert learning_rate(noam, 0.5, 15) == pytest.approx(0.001 * 0.5)
    cosine = TrainingConfig(learning_rate=0.002, warmup_steps=4, lr_decay="cosine", min_learning_rate=1e-4)
    run = 24  # updates 0..23; the warm-up's 4, then 20 on the cosine, the last at the floor
    got = [learning_rate(cosine, 1.0, updates, run) for updates in range(run + 3)]
    expected = [0.002 * (u + 1) / 4 for u in range(4)] + [
        1e-4 + (0.002 - 1e-4) * 0.5 * (1 + math.cos(math.pi * (u - 4) / 19)) for u in range(4, run)
    ]
    assert got[:run] == pytest.approx(expected)
    assert got[3] == got[4] == pytest.approx(0.002) and got[run - 1] == pytest.approx(1e-4)
    assert got[run:] == pytest.approx([1e-4] * 3)  # a run trained past its target stays at the floor
    # the plateau factor scales the peak; the floor holds unless the halved peak is below it
    assert learning_rate(cosine, 0.5, 4, run) == pytest.approx(0.001)
    assert learning_rate(cosine, 0.01, 10, run) == pytest.approx(0.002 * 0.01)
