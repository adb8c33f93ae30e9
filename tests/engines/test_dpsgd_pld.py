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
