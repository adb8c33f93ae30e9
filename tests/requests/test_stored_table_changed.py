"""A local dataset's stored file changed or damaged after registration (an operator, a
restored backup, disk damage): refused before the read, refunded, with a fixed text for
the analyst. Before, a CSV parser's message quoting the damaged row (``Expected 4 columns,
got 5: 15,82,43865.82,south,SECRET...``) was the analyst's error detail and the worker
log's line, free of charge; a file edited so that it still parsed was answered on."""

import logging
import os

import pytest

from governance.datasets.files import dataset_path
from governance.models import LedgerEntry

pytestmark = pytest.mark.django_db
URL = "/api/requests/"
SECRET = "SECRET-ROW-alice"


def damage(path, mode):
    lines = path.read_text().splitlines()
    if mode == "extra_field":  # no longer parses; the parser quotes the line
        lines[5] += f",{SECRET}"
    elif mode == "bad_number":  # a double column's cell not a number
        cells = lines[5].split(",")
        cells[2] = SECRET
        lines[5] = ",".join(cells)
    else:  # still parses: one income changed, same size (and with "mtime_back", its time put back)
        cells = lines[5].split(",")
        cells[2] = "".join(sorted(cells[2], reverse=True)) if mode == "mtime_back" else (
            cells[2][::-1] if cells[2][::-1] != cells[2] else cells[2] + "1")
        lines[5] = ",".join(cells)
    st = path.stat()
    path.write_text("\n".join(lines) + "\n")
    if mode == "mtime_back":  # the worker's cache of hashed versions was keyed on size and mtime
        assert path.stat().st_size == st.st_size
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def ask(client, django_capture_on_commit_callbacks, epsilon):
    with django_capture_on_commit_callbacks(execute=True):  # epsilons differ: not a replay
        r = client.post(URL, {"dataset": "clinic", "engine": "aggregates", "kind": "sum",
                              "params": {"column": "income", "epsilon": epsilon}}, format="json")
    assert r.status_code == 202, r.content
    return client.get(f"{URL}{r.json()['id']}/").json()


@pytest.mark.parametrize("mode", ["extra_field", "bad_number", "same_size_edit", "mtime_back"])
def test_a_changed_stored_table_is_refused_refunded_and_quoted_to_nobody_but_the_officer(
        api, analyst, officer, make_dataset, grant, django_capture_on_commit_callbacks, caplog, mode):
    ds = make_dataset("clinic", epsilon=5.0)
    grant(analyst, ds)
    client = api(analyst)
    assert ask(client, django_capture_on_commit_callbacks, 0.5)["status"] == "succeeded"  # read and cached
    path = dataset_path(ds)
    original = path.read_bytes()
    damage(path, mode)
    with caplog.at_level(logging.DEBUG):
        body = ask(client, django_capture_on_commit_callbacks, 0.6)
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_before_read", body["error"]
    assert "no longer as registered" in body["error"]["detail"]
    assert SECRET not in str(body) and str(path) not in str(body)
    assert body["charge"]["ledger_status"] == "released"
    assert SECRET not in caplog.text
    said = api(officer).get(f"{URL}{body['id']}/").json()["officer_report"]["failure"]
    assert "not the one registered" in said, said
    path.write_bytes(original)  # put back: answered again
    assert ask(client, django_capture_on_commit_callbacks, 0.7)["status"] == "succeeded"
    assert LedgerEntry.objects.filter(status="committed").count() == 2
