"""The fault hooks tests kill engines with live in slime/testing, not on the production `RolloutManager`
(tests/test_rollout_e2e.py, test_push_faults.py and test_train_recovery.py use them through the subclass)."""

from __future__ import annotations

HOOKS = {"kill_engine", "kill_engine_during_push", "router_pid", "router_alive"}


def test_the_production_manager_has_no_fault_hooks_and_the_testing_subclass_has_them():
    from slime.ray.rollout_manager import RolloutManager
    from slime.testing.fault_manager import FaultInjectingManager
    from slime.testing.manager_probe import manager_and_trainer

    assert not HOOKS & set(dir(RolloutManager))
    assert issubclass(FaultInjectingManager, RolloutManager) and HOOKS <= set(dir(FaultInjectingManager))
    assert "FaultInjectingManager" in manager_and_trainer.__wrapped__.__code__.co_names  # the push-fault tests
