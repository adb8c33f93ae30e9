"""PLD certification of one pre-planned DP-SGD run (engines/dpsgd/pld.py): tighter than
the ledger's RDP, never below the optimistic PLD, and the calibration meets its target."""

import pytest

from engines.dpsgd import calibrate, pld


@pytest.mark.parametrize("q,z,steps", [(0.01, 1.1, 300), (0.004, 0.9, 500), (0.05, 2.0, 50)])
def test_pld_certifies_below_rdp(q, z, steps):
    by_pld = pld.epsilon(q, z, steps, 0.0, 0, 1e-5)
    by_rdp = calibrate.epsilon(q, z, steps, 0.0, 0, 1e-5)
    assert 0 < by_pld < by_rdp


def test_evaluations_add_to_the_run():
    assert pld.epsilon(0.01, 1.1, 300, 0.05, 3, 1e-5) > pld.epsilon(0.01, 1.1, 300, 0.0, 0, 1e-5)
    assert pld.epsilon(0.01, 1.1, 0, 0.0, 0, 1e-5) == 0.0


def test_calibration_meets_the_target_and_is_tight():
    z = pld.noise_multiplier(2.0, 1e-5, 0.02, 100)
    assert pld.epsilon(0.02, z, 100, 0.0, 0, 1e-5) <= 2.0
    assert pld.epsilon(0.02, z * (1 - 2 * pld.REL_TOL), 100, 0.0, 0, 1e-5) > 2.0
    assert z < calibrate.noise_multiplier(2.0, 1e-5, 0.02, 100)  # less noise than RDP needs


def test_max_steps_is_the_last_step_count_within_target():
    def certify(q, z, t, d):
        return calibrate.epsilon(q, z, t, 0.0, 0, d)

    t = pld.max_steps(1.0, 1e-5, 0.01, 1.0, certify)
    assert certify(0.01, 1.0, t, 1e-5) <= 1.0 < certify(0.01, 1.0, t + 1, 1e-5)
    assert pld.max_steps(1e-6, 1e-5, 0.01, 1.0, certify) == 0


def test_too_small_a_target_is_refused():
    with pytest.raises(calibrate.CalibrationError, match="too small"):
        pld.noise_multiplier(1e-6, 1e-5, 0.5, 10_000)


# --------------------------------------------------------------------------- the planner


def _plan(accountant, allow):
    import json
    from dataclasses import asdict, replace

    from engines import plugins
    from engines.types import EngineRequest, Plan
    from tests.engines.dpsgd_helpers import rows_meta

    params = {"target": "y", "features": ["x1", "x2", "c"], "target_epsilon": 2.0, "epochs": 2, "batch_size": 64,
              "eval_epsilon": 0.0, "accountant": accountant}
    p = plugins.plan("dpsgd", EngineRequest("train", params), replace(rows_meta(), allow_pld=allow))
    return Plan(**json.loads(json.dumps(asdict(p))))


def test_the_planner_refuses_pld_unless_the_dataset_allows_it():
    from engines.types import PlanError

    with pytest.raises(PlanError) as e:
        _plan("pld", allow=False)
    assert "pld_certification" in e.value.errors["accountant"]
    with pytest.raises(PlanError) as e:
        _plan("moments", allow=True)
    assert "accountant" in e.value.errors


def test_a_pld_plan_needs_less_noise_and_records_its_certifier():
    by_rdp = _plan("rdp", allow=True).details["runs"][0]
    by_pld = _plan("pld", allow=True).details["runs"][0]
    assert by_rdp["certified_by"] == "rdp" and by_rdp["certified_epsilon"] == by_rdp["planned_epsilon"] <= 2.0
    assert by_pld["certified_by"] == "pld" and by_pld["certified_epsilon"] <= 2.0
    assert by_pld["noise_multiplier"] < by_rdp["noise_multiplier"]
    # the ledger charges the same event by its RDP curve: more than the PLD certificate
    assert by_pld["planned_epsilon"] > by_pld["certified_epsilon"]
    assert by_pld["event"]["kind"] == "subsampled_gaussian"
