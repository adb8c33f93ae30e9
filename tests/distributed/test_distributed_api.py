"""Distributed datasets through the REST API, on a real local Dask cluster: registered from
Parquet partitions (units counted across partitions), planned exactly as the same table
registered locally, answered on the cluster; a missing partition or one with another
schema fails the request before the read and refunds it; a second delivery charges nothing."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from governance.requests.execution import execute
from governance.models import AuditRecord, Dataset, LedgerEntry, Request

from .conftest import make_table, write_by_unit, write_partitions

pytestmark = pytest.mark.django_db
BOUNDS = {"age": {"lower": 18, "upper": 90}, "income": {"lower": 0, "upper": 100_000}}
N = 6_000


@pytest.fixture
def on_cluster(settings, dask_cluster):
    settings.DASK_SCHEDULER_ADDRESS = dask_cluster
    return dask_cluster


@pytest.fixture
def table():
    return make_table(N, seed=5)


@pytest.fixture
def parts_dir(import_dir, table):
    directory = import_dir / "events"
    write_partitions(table, directory, 4)
    return directory


def register(client, name, path, execution):
    r = client.post("/api/datasets/", {"name": name, "path": str(path), "execution": execution, "unit_column": "pid",
                                       "schema": BOUNDS, "budget_epsilon": 1e6, "activate": True}, format="json")
    assert r.status_code == 201, r.json()
    return r.json()


@pytest.fixture
def events(api, officer, analyst, grant, on_cluster, parts_dir):
    body = register(api(officer), "events", parts_dir, "distributed")
    ds = Dataset.objects.get(name="events")
    grant(analyst, ds)
    return body


def ask(client, dataset, kind, params, capture, engine="aggregates"):
    with capture(execute=True):
        r = client.post("/api/requests/", {"dataset": dataset, "engine": engine, "kind": kind,
                                           "params": params}, format="json")
    assert r.status_code == 202, r.json()
    return client.get(f"/api/requests/{r.json()['id']}/").json()


def test_it_registers_partitions_where_they_are(events, table, parts_dir, import_dir):
    pids = table.column("pid").to_numpy()
    _, per_unit = np.unique(pids, return_counts=True)
    assert events["execution"] == "distributed" and events["location"] == str(parts_dir)
    assert [p["path"] for p in events["partitions"]] == [f"part-{i:04d}.parquet" for i in range(4)]
    assert events["n_rows"] == N and events["n_units"] == len(per_unit)
    assert events["max_rows_per_unit"] == int(per_unit.max())
    cols = {c["name"]: c for c in events["columns"]}
    assert cols["site"]["domain"] == ["east", "north", "secret-site", "south"] and cols["site"]["domain_from_data"]
    assert cols["pid"]["type"] == "unit" and cols["flag"]["domain"] == [False, True]
    assert not list((import_dir.parent / "data").glob("datasets/events*"))  # not copied


def test_it_plans_and_answers_as_the_local_dataset(api, officer, analyst, grant, events, table, import_dir,
                                                   on_cluster, django_capture_on_commit_callbacks):
    pq.write_table(table, import_dir / "whole.parquet")
    local = register(api(officer), "whole", import_dir / "whole.parquet", "local")
    assert {k: local[k] for k in ("n_rows", "n_units", "max_rows_per_unit", "columns")} == \
        {k: events[k] for k in ("n_rows", "n_units", "max_rows_per_unit", "columns")}
    grant(analyst, Dataset.objects.get(name="whole"))
    client = api(analyst)
    params = {"column": "income", "group_by": "site", "epsilon": 1e6, "max_rows_per_unit": 40}
    dist = ask(client, "events", "mean", params, django_capture_on_commit_callbacks)
    here = ask(client, "whole", "mean", params, django_capture_on_commit_callbacks)
    assert dist["status"] == here["status"] == "succeeded"
    assert dist["event"] == here["event"] and dist["charge"]["rdp"] == here["charge"]["rdp"]
    job = Request.objects.get(pk=dist["id"]).officer_report["cluster"]  # the officer sees the cluster job
    assert job["scheduler"] == on_cluster and job["partitions"] == 4 and job["graph_key"]
    assert dist["officer_report"] is None and "cluster" not in str(dist["result"])  # not the analyst
    for a, b in zip(dist["result"]["groups"], here["result"]["groups"]):
        assert a["key"] == b["key"] and a["value"] == pytest.approx(b["value"], rel=1e-4)


def _charged(ds_name):
    entry = LedgerEntry.objects.get(dataset__name=ds_name)
    return entry.status


def said_to_the_officer(api, officer, body) -> str:
    """A run refused for a partition: the analyst is told no more than that (a partition's
    name can carry values, diagnosis=HIV/, and its rows now are an exact count, free of
    charge); the officer's view of the request says which and why."""
    detail = body["error"]["detail"]
    assert "the dataset's table (or a partition of it) is missing, unreadable or no longer as registered" in detail, detail
    assert ".parquet" not in detail and "rows" not in detail and "registered with" not in detail
    return api(officer).get(f"/api/requests/{body['id']}/").json()["officer_report"]["failure"]


def test_a_missing_partition_fails_before_the_read_and_is_refunded(api, officer, analyst, events, parts_dir,
                                                                    django_capture_on_commit_callbacks):
    (parts_dir / "part-0002.parquet").unlink()
    body = ask(api(analyst), "events", "count", {"epsilon": 0.5}, django_capture_on_commit_callbacks)
    assert body["status"] == "failed"
    assert body["error"]["code"] == "request.failed_before_read"
    assert "partition 'part-0002.parquet' is missing" in said_to_the_officer(api, officer, body)
    assert str(parts_dir) not in body["error"]["detail"]  # no server path shown to the analyst
    assert _charged("events") == "released" and body["charge"]["rdp"]["epsilon"] == 0
    assert "officer_report" not in body or body["officer_report"] is None


def test_a_partition_with_another_schema_fails_before_the_read_and_is_refunded(
        api, officer, analyst, events, parts_dir, table, django_capture_on_commit_callbacks):
    part = pq.read_table(parts_dir / "part-0001.parquet")
    part = part.set_column(part.schema.get_field_index("income"), "income",
                           pa.array([str(v) for v in part.column("income").to_pylist()]))
    pq.write_table(part, parts_dir / "part-0001.parquet")
    body = ask(api(analyst), "events", "sum", {"column": "age", "epsilon": 0.5, "max_rows_per_unit": 3},
               django_capture_on_commit_callbacks)
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_before_read"
    failure = said_to_the_officer(api, officer, body)
    assert "partition 'part-0001.parquet' has a different schema" in failure
    assert "'income' is string, registered as double" in failure
    assert _charged("events") == "released"


def test_a_partition_rewritten_with_as_many_other_rows_fails_before_the_read_and_is_refunded(
        api, officer, analyst, events, parts_dir, django_capture_on_commit_callbacks):
    """Every row of a file given to one unit, the row count kept (a helper's probe): answered
    on the new rows, with the registered units and most rows per unit stale. The size in
    bytes (in the manifest since registration) tells."""
    part = pq.read_table(parts_dir / "part-0001.parquet")
    part = part.set_column(part.schema.get_field_index("pid"), "pid", pa.array([7] * part.num_rows, pa.int64()))
    pq.write_table(part, parts_dir / "part-0001.parquet")
    body = ask(api(analyst), "events", "count", {"epsilon": 0.5}, django_capture_on_commit_callbacks)
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_before_read", body
    failure = said_to_the_officer(api, officer, body)
    assert "part-0001.parquet" in failure and "rewritten since registration" in failure
    assert _charged("events") == "released"


def test_registration_refuses_partitions_that_disagree(api, officer, on_cluster, import_dir, table):
    directory = import_dir / "mixed"
    write_partitions(table, directory, 2)
    pq.write_table(table.drop_columns(["flag"]), directory / "part-0001.parquet")
    r = api(officer).post("/api/datasets/", {"name": "mixed", "path": str(directory), "execution": "distributed",
                                             "budget_epsilon": 1.0}, format="json")
    assert r.status_code == 400 and r.json()["code"] == "dataset.partition_invalid"
    assert "column 'flag' is missing" in r.json()["detail"]
    r = api(officer).post("/api/datasets/", {"name": "up", "execution": "distributed", "budget_epsilon": 1.0,
                                             "path": "/etc"}, format="json")
    assert r.status_code == 400 and "outside the directories" in r.json()["detail"]


def test_a_second_delivery_charges_nothing(api, analyst, events, django_capture_on_commit_callbacks):
    body = ask(api(analyst), "events", "count", {"epsilon": 0.5}, django_capture_on_commit_callbacks)
    assert body["status"] == "succeeded"
    records = AuditRecord.objects.count()
    assert execute(body["id"]) == "succeeded"  # the task delivered again (acks_late, a worker lost)
    entry = LedgerEntry.objects.get()
    assert entry.status == "committed" and AuditRecord.objects.count() == records
    assert Request.objects.get(pk=body["id"]).result == body["result"]


def test_the_officer_edits_a_distributed_datasets_schema(api, officer, events):
    """Schema edits are checked against the Arrow schema recorded from the footers."""
    r = api(officer).patch("/api/datasets/events/", {"schema": {"age": {"lower": 0, "upper": 120}}}, format="json")
    assert r.status_code == 200, r.json()
    assert {c["name"]: c for c in r.json()["columns"]}["age"]["upper"] == 120
    r = api(officer).patch("/api/datasets/events/", {"schema": {"nope": {"type": "numeric"}}}, format="json")
    assert r.status_code == 400


def test_nullable_false_is_checked_against_the_partitions(api, officer, on_cluster, parts_dir):
    """income holds NaN in every partition (make_table): the declaration is refused at
    registration, and a schema edit cannot add it later (the rows are read at registration)."""
    client = api(officer)
    schema = {**BOUNDS, "income": {**BOUNDS["income"], "nullable": False}}
    r = client.post("/api/datasets/", {"name": "nn", "path": str(parts_dir), "execution": "distributed",
                                       "unit_column": "pid", "schema": schema, "budget_epsilon": 1.0}, format="json")
    assert r.status_code == 400 and "income" in r.json()["errors"], r.json()
    register(client, "events", parts_dir, "distributed")
    r = client.patch("/api/datasets/events/", {"schema": {"age": {"lower": 0, "upper": 120, "nullable": False}}},
                     format="json")
    assert r.status_code == 400 and "age" in r.json()["errors"], r.json()
    schema = {**BOUNDS, "age": {**BOUNDS["age"], "nullable": False}}  # age has no nulls: accepted
    r = client.post("/api/datasets/", {"name": "ok", "path": str(parts_dir), "execution": "distributed",
                                       "unit_column": "pid", "schema": schema, "budget_epsilon": 1.0}, format="json")
    assert r.status_code == 201, r.json()


def test_a_unit_level_run_reads_each_footer_once(events, monkeypatch):
    """The manifest check and the unit ids' range come from the same footer read (on an
    object store each read is a round trip); the range equals integer_range's."""
    from engines.distributed import cluster, source
    from governance.datasets import partitions

    ds = Dataset.objects.get(name="events")
    opened = []
    real_open = source.open_file
    monkeypatch.setattr(source, "open_file", lambda path: opened.append(path) or real_open(path))
    table = partitions.open_columns(ds, ["age"])
    assert sorted(opened) == sorted(table.paths) and len(opened) == 4  # one footer read per partition
    assert table.unit_range is not ... and table.unit_range == source.integer_range(table.paths, "pid")
    opened.clear()
    assert cluster._id_ranges(table, "pid", 8) is not None  # compact ids: range buckets, from the known range
    assert opened == []
    assert table.max_rows_per_unit == ds.max_rows_per_unit  # the hint of the row-level try (aggregates._within_bound)
    assert table.unit_ranges == source.file_ranges(table.paths, "pid")  # the per-file try's (aggregates._within_files)


def test_a_table_written_by_unit_answers_without_dealing_rows(api, officer, analyst, grant, on_cluster, import_dir,
                                                              monkeypatch, django_capture_on_commit_callbacks):
    """Each file holds its own range of unit ids: a bound below the units' rows is kept file
    by file (no rows dealt), and the answer is the same table's registered locally (both
    runs given one bounding salt, so they keep the same rows)."""
    from engines.aggregates import execute as local
    from engines.distributed import aggregates as dist
    from engines.distributed import cluster


    table = make_table(N, seed=9)
    write_by_unit(table, import_dir / "sorted", 4)
    pq.write_table(table, import_dir / "same.parquet")
    client = api(officer)
    register(client, "sorted", import_dir / "sorted", "distributed")
    register(client, "same", import_dir / "same.parquet", "local")
    for name in ("sorted", "same"):
        grant(analyst, Dataset.objects.get(name=name))

    def refuse(*a, **k):
        raise AssertionError("rows were dealt")

    monkeypatch.setattr(cluster, "by_unit", refuse)
    fixed, real = 0x5EED, local.exact_parts

    def salted(d, data, n_max, rng, progress=local._noop, salt=None):
        return real(d, data, n_max, rng, progress, fixed if salt is None else salt)

    monkeypatch.setattr(dist, "new_salt", lambda: fixed)
    monkeypatch.setattr(local, "exact_parts", salted)
    params = {"column": "income", "group_by": "site", "epsilon": 1e6, "max_rows_per_unit": 1}
    dist = ask(api(analyst), "sorted", "sum", params, django_capture_on_commit_callbacks)
    here = ask(api(analyst), "same", "sum", params, django_capture_on_commit_callbacks)
    assert dist["status"] == here["status"] == "succeeded", dist
    for a, b in zip(dist["result"]["groups"], here["result"]["groups"]):
        assert a["key"] == b["key"] and a["value"] == pytest.approx(b["value"], rel=1e-3)


def test_a_unit_column_of_dates_registers_and_answers(api, officer, analyst, grant, on_cluster, import_dir,
                                                      django_capture_on_commit_callbacks):
    """Dates are Parquet integers underneath, with date statistics: the footer range read
    once raised a TypeError on them (a 500 at registration). Now the units are dealt by
    hash, counted once, and the answer is exact."""
    table = make_table(3_000, seed=8)
    days = table.column("pid").to_numpy().astype("datetime64[D]")
    table = table.set_column(0, "pid", pa.array(days))
    write_partitions(table, import_dir / "dated", 3)
    body = register(api(officer), "dated", import_dir / "dated", "distributed")
    assert body["n_units"] == len(np.unique(days))
    grant(analyst, Dataset.objects.get(name="dated"))
    got = ask(api(analyst), "dated", "count", {"epsilon": 1e5, "max_rows_per_unit": 1},
              django_capture_on_commit_callbacks)
    assert got["status"] == "succeeded" and round(got["result"]["value"]) == len(np.unique(days))


# ------------------------------------------------------------------ links (a hostile probe, 2026-11-27)


@pytest.fixture
def outside(tmp_path, table):
    """A Parquet file outside DATASET_IMPORT_DIRS, with the registered schema."""
    directory = tmp_path / "outside"
    directory.mkdir()
    pq.write_table(table.slice(0, 100), directory / "secret.parquet")
    return directory


def _refused(client, name, path):
    r = client.post("/api/datasets/", {"name": name, "path": str(path), "execution": "distributed",
                                       "unit_column": "pid", "budget_epsilon": 1.0}, format="json")
    assert r.status_code == 400, r.json()
    assert r.json()["code"] == "dataset.partition_invalid"
    return r.json()["detail"]


@pytest.mark.parametrize("how", ["file", "directory", "loop", "hard"])
def test_registration_refuses_partitions_reached_through_links(api, officer, on_cluster, parts_dir, outside, how):
    """A link to a file or directory outside the import directories was registered and read;
    a link to the directory itself listed one file under 41 names (every row counted 41
    times: sensitivity understated 41-fold); a hard link is one file under two names."""
    if how == "file":
        (parts_dir / "zz.parquet").symlink_to(outside / "secret.parquet")
    elif how == "directory":
        (parts_dir / "sub").symlink_to(outside)
    elif how == "loop":
        (parts_dir / "loop").symlink_to(".")
    else:
        (parts_dir / "zz.parquet").hardlink_to(parts_dir / "part-0001.parquet")
    detail = _refused(api(officer), "linked", parts_dir)
    assert ("the same file" if how == "hard" else "symbolic link") in detail
    assert str(outside) not in detail and not Dataset.objects.filter(name="linked").exists()


def test_a_link_elsewhere_in_the_directory_is_left_alone(api, officer, on_cluster, parts_dir, outside):
    (parts_dir / "notes.txt").symlink_to(outside / "secret.parquet")  # not a partition: not listed
    body = register(api(officer), "notes", parts_dir, "distributed")
    assert len(body["partitions"]) == 4


@pytest.mark.parametrize("swap", ["partition", "location"])
def test_a_link_put_in_place_after_registration_fails_before_the_read_and_is_refunded(
        api, officer, analyst, events, parts_dir, outside, table, swap, django_capture_on_commit_callbacks):
    if swap == "partition":  # the same schema and row count: the footer check alone passed it
        part = pq.read_table(parts_dir / "part-0003.parquet")
        pq.write_table(part, outside / "same.parquet")
        (parts_dir / "part-0003.parquet").unlink()
        (parts_dir / "part-0003.parquet").symlink_to(outside / "same.parquet")
        said = "'part-0003.parquet' is reached through a symbolic link"
    else:  # the whole directory swapped for a link to a copy outside
        import shutil

        shutil.copytree(parts_dir, outside / "copy")
        shutil.rmtree(parts_dir)
        parts_dir.symlink_to(outside / "copy")
        said = "location"
    body = ask(api(analyst), "events", "count", {"epsilon": 0.5}, django_capture_on_commit_callbacks)
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_before_read"
    assert said in said_to_the_officer(api, officer, body) and str(outside) not in body["error"]["detail"]
    assert _charged("events") == "released" and body["charge"]["rdp"]["epsilon"] == 0


def test_registration_refuses_nan_unit_ids(api, officer, on_cluster, import_dir, table):
    directory = import_dir / "nan-ids"
    pid = table.column("pid").to_numpy().astype(float)
    pid[::50] = np.nan
    write_partitions(table.set_column(table.schema.get_field_index("pid"), "pid", pa.array(pid)), directory, 3)
    r = api(officer).post("/api/datasets/", {"name": "nan-ids", "path": str(directory), "execution": "distributed",
                                             "unit_column": "pid", "budget_epsilon": 1.0}, format="json")
    assert r.status_code == 400 and f"{len(pid[::50])} empty values (null or NaN)" in r.json()["detail"]


@pytest.mark.parametrize("rest", ["%2e%2e/secret", "a/%2E%2E/%2e%2e/x", "..%2f..%2fx", "x?endpoint_override=evil:9000",
                                  "x#frag", "../x"])
def test_a_uri_must_name_a_path_under_its_prefix(api, officer, settings, rest):
    """pyarrow decodes %2e%2e to '..' (file:// URIs walked out of their directory that way)
    and takes ?endpoint_override=... as options: a location under an import prefix names
    a path under it, nothing more."""
    settings.DATASET_IMPORT_URIS = ["s3://bucket/tables/"]
    r = api(officer).post("/api/datasets/", {"name": "far", "path": "s3://bucket/tables/" + rest,
                                             "execution": "distributed", "budget_epsilon": 1.0}, format="json")
    assert r.status_code == 400 and "under its prefix" in r.json()["detail"], r.json()


def test_a_plain_uri_under_a_prefix_passes_the_path_check(settings):
    from governance.datasets.partitions import resolve_location

    settings.DATASET_IMPORT_URIS = ["s3://bucket/tables/"]
    assert resolve_location("s3://bucket/tables/2026/part-1.parquet") == "s3://bucket/tables/2026/part-1.parquet"


def test_registration_names_a_column_named_twice(api, officer, on_cluster, import_dir):
    """Was a 400 quoting Arrow's internals (__fragment_index ...)."""
    directory = import_dir / "twice"
    directory.mkdir()
    pq.write_table(pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["a", "a"]),
                   directory / "part-0.parquet")
    r = api(officer).post("/api/datasets/", {"name": "twice", "path": str(directory), "execution": "distributed",
                                             "budget_epsilon": 1.0}, format="json")
    assert r.status_code == 400 and "duplicate column names: 'a'" in r.json()["detail"]
    assert "fragment" not in r.json()["detail"]


def test_a_cluster_out_of_reach_or_without_a_worker_is_a_refund_and_no_registration(
        api, officer, analyst, events, parts_dir, settings, monkeypatch, django_capture_on_commit_callbacks):
    """A probe's cluster down: the request failed after the read, charged, though nothing
    was sent; a cluster with no worker held the request (and a registration's HTTP call,
    then a 500) until the scheduler went away. Now the run waits a bounded time for a
    worker before it sends anything, and a registration is a 503."""
    from distributed import LocalCluster

    from engines.distributed import cluster

    monkeypatch.setattr(cluster, "CONNECT_SECONDS", 2)
    monkeypatch.setattr(cluster, "WAIT_FOR_WORKER_SECONDS", 2.0)
    settings.DASK_SCHEDULER_ADDRESS = "tcp://127.0.0.1:9"  # nothing listens there
    body = ask(api(analyst), "events", "count", {"epsilon": 0.5}, django_capture_on_commit_callbacks)
    assert (body["status"], body["error"]["code"]) == ("failed", "request.failed_before_read"), body
    assert "could not be reached or had no running worker" in body["error"]["detail"]
    assert LedgerEntry.objects.get(request__id=body["id"]).status == "released"
    with LocalCluster(n_workers=0, dashboard_address=None, host="127.0.0.1") as empty:
        settings.DASK_SCHEDULER_ADDRESS = empty.scheduler_address
        body = ask(api(analyst), "events", "sum", {"column": "income", "epsilon": 0.5, "max_rows_per_unit": 2},
                   django_capture_on_commit_callbacks)
        assert (body["status"], body["error"]["code"]) == ("failed", "request.failed_before_read"), body
        assert LedgerEntry.objects.get(request__id=body["id"]).status == "released"
        r = api(officer).post("/api/datasets/", {"name": "again", "path": str(parts_dir), "execution": "distributed",
                                                 "unit_column": "pid", "schema": BOUNDS, "budget_epsilon": 1.0},
                              format="json")
        assert r.status_code == 503 and r.json()["code"] == "cluster.unavailable", r.content
        assert r["Retry-After"] == "30" and not Dataset.objects.filter(name="again").exists()


def _drafts_both_ways(client, import_dir, name, frame, files) -> dict:
    """The draft columns of ``frame`` registered from ``files`` partitions and from one
    local file (unit column pid), by execution."""
    directory = import_dir / name
    directory.mkdir()
    size = -(-len(frame) // files)
    for i in range(files):
        part = frame.iloc[i * size:(i + 1) * size]
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), directory / f"part-{i}.parquet")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), import_dir / f"{name}.parquet")
    drafts = {}
    for execution, path in (("distributed", directory), ("local", import_dir / f"{name}.parquet")):
        r = client.post("/api/datasets/", {"name": f"{name}-{execution}", "path": str(path), "execution": execution,
                                           "unit_column": "pid", "schema": {"x": {"lower": 0, "upper": 9}},
                                           "budget_epsilon": 1.0}, format="json")
        assert r.status_code == 201, r.json()
        drafts[execution] = {c["name"]: c for c in r.json()["columns"]}
    return drafts


def test_a_sparse_column_that_names_its_units_is_proposed_as_text_as_locally(api, officer, on_cluster, import_dir):
    """The units holding a value are counted per column on the cluster, as the local
    registration counts them: a case number only 40 of 2,000 patients have (one each) is
    text in both; counted as every unit of the table (2,000 >= 5 x 40), its 40 real values
    became a public domain on the partitioned table. A ward every patient has stays
    categorical."""
    import pandas as pd

    rng = np.random.default_rng(3)
    pid = np.repeat(np.arange(2_000), 3)
    frame = pd.DataFrame({"pid": pid, "ward": [f"w{p % 30}" for p in pid],
                          "case_no": [f"C{p:05d}" if p % 50 == 0 else None for p in pid],
                          "x": rng.integers(0, 10, len(pid))})
    frame = frame.sample(frac=1, random_state=1).reset_index(drop=True)
    drafts = _drafts_both_ways(api(officer), import_dir, "sparse", frame, 4)
    assert "C00050" not in json.dumps(drafts)
    kinds = {execution: {name: c["type"] for name, c in cols.items()} for execution, cols in drafts.items()}
    assert kinds["distributed"]["case_no"] == kinds["local"]["case_no"] == "text"
    assert kinds["distributed"]["ward"] == kinds["local"]["ward"] == "categorical"


def test_a_time_column_gets_the_draft_the_local_registration_gives(api, officer, on_cluster, import_dir):
    """A time of day registered from partitions was proposed as a categorical column with
    no domain, and the registration refused it (a probe); the local one proposes its values
    as the text they are matched as. Same draft both ways, and one that names its units
    (a time per person) is text both ways."""
    import datetime

    import pandas as pd

    n = 1_200
    frame = pd.DataFrame({"pid": np.arange(n) // 2, "shift": [datetime.time(6 + 8 * (i % 3)) for i in range(n)],
                          "born_at": [datetime.time((i // 2) // 60 % 24, (i // 2) % 60, 7) for i in range(n)],
                          "x": np.arange(n) % 10})
    drafts = _drafts_both_ways(api(officer), import_dir, "times", frame, 3)
    assert drafts["distributed"]["shift"] == drafts["local"]["shift"]
    assert drafts["local"]["shift"]["type"] == "categorical" and len(drafts["local"]["shift"]["domain"]) == 3
    assert drafts["distributed"]["born_at"]["type"] == drafts["local"]["born_at"]["type"] == "text"
