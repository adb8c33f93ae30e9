"""A table larger than REGISTER_INLINE_BYTES is read by a worker, not on the request thread
(issue 22: bounded work per call). The POST answers 202 with the dataset ``pending``; the
worker's task (Celery eager here, run when the POST's transaction commits) makes it draft
or active with exactly what an inline registration gives, or ``failed`` with the reason.
"""

import pytest
from django.utils import timezone

from governance.models import Dataset
from tests.conftest import small_frame

from .conftest import assert_error, stored_files, upload

URL = "/api/datasets/"
pytestmark = pytest.mark.django_db


@pytest.fixture
def off_thread(settings):
    settings.REGISTER_INLINE_BYTES = 1000  # the small test table (about 5 kB) goes to a worker


def form(data: bytes, name="clinic", **fields):
    return {"name": name, "budget_epsilon": "1.0", "file": upload(data), "unit_column": "patient_id", **fields}


def inline(api, officer, csv_bytes, settings) -> dict:
    settings.REGISTER_INLINE_BYTES = 10**9
    r = api(officer).post(URL, form(csv_bytes, name="inline"), format="multipart")
    assert r.status_code == 201, r.content
    return r.json()


def test_a_large_table_is_pending_until_a_worker_has_read_it(api, officer, csv_bytes, settings,
                                                            django_capture_on_commit_callbacks):
    want = inline(api, officer, csv_bytes, settings)
    settings.REGISTER_INLINE_BYTES = 1000
    with django_capture_on_commit_callbacks(execute=False) as sent:
        r = api(officer).post(URL, form(csv_bytes), format="multipart")
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["status"] == "pending" and body["columns"] == [] and body["n_rows"] == 0
    assert body["registration"]["activate"] is False
    assert len(sent) == 1  # the task, sent when the POST's transaction committed
    # while pending: no activation, no edit, no request
    assert_error(api(officer).post(f"{URL}clinic/activate/"), 409, "dataset.inactive")
    assert_error(api(officer).patch(f"{URL}clinic/", {"title": "x"}, format="json"), 409, "dataset.inactive")
    assert_error(api(officer).post(f"{URL}clinic/charges/", {"event": {"kind": "laplace", "epsilon": 0.1}},
                                   format="json"), 409, "dataset.inactive")
    sent[0]()  # the worker reads the table
    got = api(officer).get(f"{URL}clinic/").json()
    assert got["status"] == "draft" and got["registration"] == {}
    for key in ("columns", "n_rows", "n_units", "max_rows_per_unit", "budget_delta", "delta_auto", "sha256"):
        assert got[key] == want[key], key
    assert got["n_units"] == small_frame()["patient_id"].nunique()
    r = api(officer).post(f"{URL}clinic/activate/")
    assert r.status_code == 200 and r.json()["status"] == "active"


def test_activate_true_makes_it_active_once_read(api, officer, csv_bytes, off_thread,
                                                 django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        r = api(officer).post(URL, form(csv_bytes, activate="true"), format="multipart")
    assert r.status_code == 202
    assert Dataset.objects.get(name="clinic").status == "active"


def test_a_table_that_cannot_be_registered_fails_with_the_reason(api, officer, csv_bytes, off_thread,
                                                                 django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        r = api(officer).post(URL, form(csv_bytes, unit_column="nope"), format="multipart")
    assert r.status_code == 202
    ds = Dataset.objects.get(name="clinic")
    assert ds.status == "failed" and "'nope' is not in the table" in ds.registration["error"]
    assert stored_files() == []  # the stored copy is gone
    assert_error(api(officer).post(f"{URL}clinic/activate/"), 409, "dataset.inactive")
    # the name is free again
    with django_capture_on_commit_callbacks(execute=True):
        r = api(officer).post(URL, form(csv_bytes), format="multipart")
    assert r.status_code == 202 and Dataset.objects.get(name="clinic").status == "draft"


def test_a_stored_copy_changed_before_the_worker_read_it_fails_the_registration(
        api, officer, csv_bytes, off_thread, settings, django_capture_on_commit_callbacks):
    """A probe appended rows to the stored copy while its registration waited: it was
    registered as read (filed under the upload's digest), could be activated, and every
    request on it failed as a changed table. Now the registration fails, with the reason."""
    from governance.datasets.registry import finish_registration

    with django_capture_on_commit_callbacks(execute=False):
        r = api(officer).post(URL, form(csv_bytes), format="multipart")
    ds = Dataset.objects.get()
    with open(settings.DATA_DIR / ds.file, "ab") as f:
        f.write(csv_bytes.splitlines(keepends=True)[1])
    assert finish_registration(ds.pk) == "failed"
    body = api(officer).get(f"{URL}{r.json()['name']}/").json()
    assert body["status"] == "failed" and "changed after it was uploaded" in body["registration"]["error"]
    assert stored_files() == []


def test_a_bad_budget_is_refused_at_once(api, officer, csv_bytes, off_thread):
    r = api(officer).post(URL, form(csv_bytes, budget_delta="2"), format="multipart")
    assert_error(r, 400)
    assert not Dataset.objects.exists() and stored_files() == []


def test_analysts_do_not_see_a_pending_dataset(api, officer, analyst, csv_bytes, off_thread,
                                               django_capture_on_commit_callbacks):
    from governance.models import Grant

    with django_capture_on_commit_callbacks(execute=False):
        api(officer).post(URL, form(csv_bytes, activate="true"), format="multipart")
    # no grant is given on a pending dataset (grants.give refuses): one written in the database
    Grant.objects.create(analyst=analyst, dataset=Dataset.objects.get(name="clinic"), created_by=officer)
    assert api(analyst).get(URL).json()["results"] == []
    r = api(analyst).post("/api/requests/", {"dataset": "clinic", "engine": "aggregates", "kind": "count",
                                             "params": {"epsilon": 0.1}}, format="json")
    assert_error(r, 400)
    assert "No dataset" in r.json()["detail"]


def test_the_sweep_sends_a_lost_registration_again(api, officer, csv_bytes, off_thread, settings,
                                                   django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):  # the task is lost (a worker died)
        api(officer).post(URL, form(csv_bytes), format="multipart")
    from workers.tasks import sweep

    assert sweep.apply().get()["registrations"] == []  # too young to be lost
    Dataset.objects.filter(name="clinic").update(
        created_at=timezone.now() - timezone.timedelta(seconds=settings.REQUEST_LOST_AFTER_SECONDS + 1))
    assert sweep.apply().get()["registrations"] == [Dataset.objects.get(name="clinic").pk]
    assert Dataset.objects.get(name="clinic").status == "draft"
    assert sweep.apply().get()["registrations"] == []  # done: nothing to send


def test_a_registration_being_read_is_neither_read_twice_nor_sent_again(
        api, officer, csv_bytes, off_thread, settings, django_capture_on_commit_callbacks):
    """A probe: the sweep sent a pending registration's message again every minute while no
    worker was free, and two pool processes then read its 175 MB table at once. A reader
    holds a claim: a live one is left alone (no copy sent, a copy delivered reads nothing);
    a dead one's registration is sent again and read; one created in the database's
    future (a web clock ahead) is sent again too."""
    import socket
    import subprocess
    import sys

    from governance.datasets.registry import finish_registration
    from workers.tasks import sweep

    with django_capture_on_commit_callbacks(execute=False):
        api(officer).post(URL, form(csv_bytes), format="multipart")
    ds = Dataset.objects.get(name="clinic")
    old = timezone.now() - timezone.timedelta(seconds=settings.REQUEST_LOST_AFTER_SECONDS + 1)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    try:
        claim = {"host": socket.gethostname(), "pid": live.pid, "at": timezone.now().timestamp()}
        Dataset.objects.filter(pk=ds.pk).update(created_at=old, registration={**ds.registration, "reading": claim})
        assert sweep.apply().get()["registrations"] == []
        assert finish_registration(ds.pk) == "reading elsewhere"
        assert Dataset.objects.get(pk=ds.pk).status == "pending"
        # another host's reader: alive until the workers' hard time limit has passed
        elsewhere = {"host": "elsewhere", "pid": 1, "at": timezone.now().timestamp()}
        Dataset.objects.filter(pk=ds.pk).update(registration={**ds.registration, "reading": elsewhere})
        assert finish_registration(ds.pk) == "reading elsewhere"
        gone = {**claim, "pid": int(dead.stdout)}
        Dataset.objects.filter(pk=ds.pk).update(registration={**ds.registration, "reading": gone})
        assert sweep.apply().get()["registrations"] == [ds.pk]  # sent again, read at once (eager)
        assert Dataset.objects.get(pk=ds.pk).status == "draft"
    finally:
        live.kill()
        live.wait()
    with django_capture_on_commit_callbacks(execute=False):
        api(officer).post(URL, form(csv_bytes, name="ahead"), format="multipart")
    Dataset.objects.filter(name="ahead").update(created_at=timezone.now() + timezone.timedelta(hours=1))
    assert sweep.apply().get()["registrations"] == [Dataset.objects.get(name="ahead").pk]


def test_a_second_delivery_changes_nothing(api, officer, csv_bytes, off_thread, django_capture_on_commit_callbacks):
    from governance.datasets.registry import finish_registration

    with django_capture_on_commit_callbacks(execute=True):
        api(officer).post(URL, form(csv_bytes), format="multipart")
    ds = Dataset.objects.get(name="clinic")
    assert finish_registration(ds.pk) == "gone"
    assert Dataset.objects.get(pk=ds.pk).status == "draft"


def test_the_officer_pages_show_a_pending_and_a_failed_dataset(api, officer, csv_bytes, off_thread, client,
                                                               django_capture_on_commit_callbacks):
    from django.urls import reverse

    with django_capture_on_commit_callbacks(execute=False):
        api(officer).post(URL, form(csv_bytes), format="multipart")
    with django_capture_on_commit_callbacks(execute=True):
        api(officer).post(URL, form(csv_bytes, name="broken", unit_column="nope"), format="multipart")
    client.force_login(officer)
    for ds in Dataset.objects.all():
        for url in (reverse("admin:governance_overview", args=[ds.pk]),
                    reverse("admin:governance_dataset_change", args=[ds.pk]),
                    reverse("admin:governance_dataset_changelist"), reverse("admin:index")):
            r = client.get(url)
            assert r.status_code == 200, (url, r.status_code)
            assert ds.status in r.content.decode() or url.endswith("/admin/"), url


def test_a_small_file_that_decodes_large_is_read_by_a_worker_not_on_the_request_thread(
        api, officer, settings, django_capture_on_commit_callbacks):
    """A probe's 2.2 MB Parquet decoded to 4 GB on the web thread (within 4 x MAX_UPLOAD_BYTES,
    the file under REGISTER_INLINE_BYTES): the process kept 1.5 GB, and the next wide upload
    aborted it. Past 4 x REGISTER_INLINE_BYTES decoded, the request thread stops reading and
    hands the file to a worker."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"patient_id": np.arange(1_000_000) // 4, "z": np.zeros(1_000_000)}), buf,
                   compression="zstd")  # about 1 MB on disk, 16 MB decoded
    data = buf.getvalue()
    settings.REGISTER_INLINE_BYTES = len(data) + 1  # small enough to be read here by its size on disk
    settings.MAX_UPLOAD_BYTES = 10**9
    assert 4 * settings.REGISTER_INLINE_BYTES < 16_000_000
    with django_capture_on_commit_callbacks(execute=False) as sent:
        r = api(officer).post(URL, {"name": "wide", "budget_epsilon": "1.0", "file": upload(data, "t.parquet"),
                                    "unit_column": "patient_id"}, format="multipart")
    assert r.status_code == 202 and r.json()["status"] == "pending", r.content[:300]
    sent[0]()  # the worker reads it within 4 x MAX_UPLOAD_BYTES
    got = api(officer).get(f"{URL}wide/").json()
    assert got["status"] == "draft" and got["n_rows"] == 1_000_000 and got["n_units"] == 250_000


def test_a_registration_that_ran_out_of_memory_replaces_its_pool_process(
        api, officer, csv_bytes, off_thread, monkeypatch, django_capture_on_commit_callbacks):
    """A probe's registration read ran out of memory in a worker: the dataset failed with
    the reason, and the pool process kept what it had allocated (a run's out of memory
    replaces its process; a registration's did not). Now both do."""
    from pyarrow import csv as pacsv

    from governance.core import processes
    from workers import tasks

    def too_large(*args, **kwargs):
        raise MemoryError("realloc of size 1048576 failed")

    with django_capture_on_commit_callbacks(execute=False):
        r = api(officer).post(URL, form(csv_bytes), format="multipart")
    assert r.status_code == 202
    ds = Dataset.objects.get()
    monkeypatch.setattr(pacsv, "read_csv", too_large)
    monkeypatch.setattr(tasks, "_IN_POOL_PROCESS", [True])  # as in a prefork pool's child
    processes.OUT_OF_MEMORY.clear()
    try:
        with pytest.raises(SystemExit):
            tasks.register_dataset.run(ds.pk)
    finally:
        processes.OUT_OF_MEMORY.clear()
    ds.refresh_from_db()
    assert ds.status == "failed" and "within this process's memory" in ds.registration["error"]
    assert stored_files() == []
