"""A top-level ``null`` parameter is a parameter not given, for every engine and kind: its
estimate is the one without it, and a run with it is the run without it. An engine's own
check had let ``"max_grad_norm": null`` through to the run (admitted, charged, failed
after the read) and ``"rounds": null`` raise a 500."""

import pytest

from engines import plugins

BASE = {
    ("aggregates", "count"): {"epsilon": 0.5},
    ("aggregates", "sum"): {"epsilon": 0.5, "column": "income"},
    ("aggregates", "mean"): {"epsilon": 0.5, "column": "income"},
    ("aggregates", "variance"): {"epsilon": 0.5, "column": "income"},
    ("aggregates", "histogram"): {"epsilon": 0.5, "column": "site"},
    ("aggregates", "quantile"): {"epsilon": 0.5, "column": "age", "q": 0.5},
    ("aggregates", "query"): {"epsilon": 0.5, "select": [{"agg": "count"}]},
    ("dpsgd", "train"): {"target": "site", "target_epsilon": 2.0, "epochs": 2},
    ("dpsgd", "sweep"): {"target": "site", "epsilons": [2.0], "epochs": 2},
    ("synthesis", "synthesize"): {"epsilon": 1.0},
}
KINDS = sorted(BASE)

@pytest.fixture
def client(api, analyst, make_dataset, grant, no_rate_limit):
    ds = make_dataset("clinic", epsilon=1e3)
    grant(analyst, ds)
    c = api(analyst)
    c.raise_request_exception = False
    return c


def _estimate(client, engine, kind, params):
    r = client.post("/api/datasets/clinic/estimate/", {"engine": engine, "kind": kind, "params": params},
                    format="json")
    body = r.json()
    body.pop("request", None)  # (the request as asked: with or without the null)
    return r.status_code, body


@pytest.mark.django_db
@pytest.mark.parametrize("engine, kind", KINDS)
def test_a_null_parameter_is_the_parameter_not_given(client, engine, kind):
    base = BASE[(engine, kind)]
    differ, plain = [], _estimate(client, engine, kind, base)
    for name in sorted(plugins.info(engine)["params_schema"][kind].get("properties", {})):
        null = _estimate(client, engine, kind, {**base, name: None})
        absent = _estimate(client, engine, kind, {k: v for k, v in base.items() if k != name}) if name in base else plain
        if null != absent:
            differ.append((name, null, absent))
    assert not differ, differ


@pytest.mark.django_db
def test_a_training_with_a_null_clip_norm_runs_with_the_default(client, django_capture_on_commit_callbacks):
    params = {"target": "site", "features": ["age", "income"], "target_epsilon": 2.0, "epochs": 1,
              "max_grad_norm": None, "learning_rate": None, "test_fraction": None}
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post("/api/requests/", {"dataset": "clinic", "engine": "dpsgd", "kind": "train", "params": params},
                        format="json")
    assert r.status_code == 202, r.content
    body = client.get(f"/api/requests/{r.json()['id']}/").json()
    assert body["status"] == "succeeded", body
    assert body["params"] == {"target": "site", "features": ["age", "income"], "target_epsilon": 2.0, "epochs": 1}
