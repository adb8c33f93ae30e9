"""Published guidance as numbers: GET /api/datasets/{name}/recommendation/."""

import pytest

from tests.conftest import small_frame

from .conftest import assert_error

pytestmark = pytest.mark.django_db


def url(name="clinic"):
    return f"/api/datasets/{name}/recommendation/"


@pytest.mark.parametrize("sensitivity, low, high", [("high", 0.1, 1.0), ("medium", 1.0, 3.0), ("low", 3.0, 10.0)])
def test_it_recommends_an_epsilon_range_and_delta(api, officer, make_dataset, sensitivity, low, high):
    make_dataset("clinic")
    r = api(officer).get(url(), {"sensitivity": sensitivity})
    assert r.status_code == 200, r.json()
    body = r.json()
    n = len(small_frame())
    assert body["sensitivity"] == sensitivity
    assert body["epsilon_range"] == [low, high]
    assert body["privacy_units"] == n
    assert body["delta_recommended"] == pytest.approx(min(1 / n ** 1.2, 1e-3))
    assert body["delta_max"] == pytest.approx(1 / n)
    assert body["delta_recommended"] < body["delta_max"]
    assert body["sources"]


def test_it_defaults_to_medium(api, officer, make_dataset):
    make_dataset("clinic")
    assert api(officer).get(url()).json()["epsilon_range"] == [1.0, 3.0]


def test_it_counts_privacy_units_not_rows(api, officer, make_dataset):
    make_dataset("clinic", unit_column="patient_id")
    n_units = small_frame()["patient_id"].nunique()
    body = api(officer).get(url()).json()
    assert body["privacy_units"] == n_units
    assert body["delta_recommended"] == pytest.approx(min(1 / n_units ** 1.2, 1e-3))


def test_it_warns_below_5000_units(api, officer, make_dataset):
    make_dataset("clinic")
    warnings = api(officer).get(url()).json()["warnings"]
    assert len(warnings) == 1 and "5000" in warnings[0]


@pytest.mark.parametrize("n, warned", [(4999, True), (5000, False)])
def test_it_warns_only_below_the_threshold(api, officer, make_dataset, n, warned):
    make_dataset("clinic", frame=small_frame(n=n))
    assert bool(api(officer).get(url()).json()["warnings"]) is warned


def test_it_answers_analysts_with_a_grant(api, analyst, make_dataset, grant):
    grant(analyst, make_dataset("clinic"))
    assert api(analyst).get(url(), {"sensitivity": "high"}).json()["epsilon_range"] == [0.1, 1.0]


def test_it_answers_404_without_a_grant(api, outsider, make_dataset):
    make_dataset("clinic")
    assert_error(api(outsider).get(url()), 404)


@pytest.mark.parametrize("sensitivity", ["extreme", "HIGH", "", "1"])
def test_it_refuses_an_unknown_sensitivity(api, officer, make_dataset, sensitivity):
    make_dataset("clinic")
    body = assert_error(api(officer).get(url(), {"sensitivity": sensitivity}), 400, "request.invalid")
    assert "high" in body["detail"]
