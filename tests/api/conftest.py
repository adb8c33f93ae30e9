"""Helpers shared by the REST API tests (fixtures live in ``tests/conftest.py``)."""

import io

import pandas as pd
import pytest
from django.conf import settings

from tests.conftest import small_frame


def upload(data: bytes, name: str = "table.csv"):
    f = io.BytesIO(data)
    f.name = name
    return f


def parquet_bytes(frame=None) -> bytes:
    buf = io.BytesIO()
    (frame if frame is not None else small_frame()).to_parquet(buf, index=False)
    return buf.getvalue()


def stored_files() -> list:
    d = settings.DATA_DIR / "datasets"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def assert_error(resp, status: int, code: str | None = None):
    assert resp.status_code == status, (resp.status_code, resp.content[:500])
    body = resp.json()
    assert "code" in body and "detail" in body, body
    if code is not None:
        assert body["code"] == code, body
    return body


def text(resp) -> str:
    return resp.content.decode()


@pytest.fixture
def income_values(csv_bytes):
    """The raw income cells of ``csv_bytes``, as they are written in the file."""
    frame = pd.read_csv(io.BytesIO(csv_bytes), dtype=str)
    return set(frame["income"])
