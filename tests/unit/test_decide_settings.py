"""Settings changed while running reach the parts of the decision core that own them."""

from __future__ import annotations

import pytest

from oomguard._decide import DecisionCore
from oomguard._models import FailureEvent


def test_configure_applies_each_setting_through_its_owner():
    core = DecisionCore(grace=5.0, max_shard_infra_failures=3)
    core.configure(report_grace=9.0, max_shard_infra_failures=1, abort_on_repeat_signature=False)
    assert core.pairing.grace == 9.0
    assert core.policy.max_shard_infra_failures == 1
    assert core.policy.abort_on_repeat_signature is False
    core.policy.pipeline_submitted("etl", ["a"])
    event = FailureEvent("infra", "sigkill", "a", "etl", "tcp://w:1", "w", "", "")
    assert core.policy.record(event).count == 1  # one failure is now the limit


def test_configure_refuses_a_bad_limit():
    with pytest.raises(ValueError, match="max_shard_infra_failures is 0"):
        DecisionCore().configure(
            report_grace=5.0, max_shard_infra_failures=0, abort_on_repeat_signature=True
        )
