"""The Django admin, as a privacy officer uses it: list views with budgets, registering a
table by upload, editing the schema, granting."""

import json

import pytest

from governance.ledger import actions as ledger
from governance.models import Dataset, Grant

pytestmark = pytest.mark.django_db


@pytest.fixture
def officer_client(client, officer):
    client.force_login(officer)
    return client


def test_it_lists_every_model_with_budget_columns(officer_client, make_dataset, analyst, grant):
    ds = make_dataset(epsilon=2.0)
    grant(analyst, ds)
    ledger.commit(ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.5}))
    page = officer_client.get("/admin/governance/dataset/")
    assert page.status_code == 200
    assert b"0.5 / 2" in page.content  # spent / budget
    for model in ("grant", "ledgerentry", "budget"):
        assert officer_client.get(f"/admin/governance/{model}/").status_code == 200
    entry_page = officer_client.get(f"/admin/governance/ledgerentry/{ds.ledger.first().pk}/change/")
    assert entry_page.status_code == 200 and b"laplace" in entry_page.content


def test_no_admin_page_shows_an_api_token_not_even_to_a_superuser(client, django_user_model, analyst):
    """DRF's TokenAdmin listed every live key in clear at /admin/authtoken/tokenproxy/ to an
    officer made with createsuperuser (as the docs make one), who could then read an
    analyst's results as her. A token is shown once, when issued."""
    from rest_framework.authtoken.models import Token

    key = Token.objects.get_or_create(user=analyst)[0].key
    root = django_user_model.objects.create_superuser("root", "root@example.org", "pw")
    client.force_login(root)
    for url in ("/admin/authtoken/tokenproxy/", "/admin/authtoken/token/", "/admin/authtoken/"):
        assert client.get(url).status_code == 404, url
    for url in ("/admin/", f"/admin/auth/user/{analyst.pk}/change/", "/admin/auth/user/"):
        page = client.get(url)
        assert page.status_code == 200 and key.encode() not in page.content and b"authtoken" not in page.content


def test_it_registers_an_uploaded_table_as_a_draft(officer_client, csv_bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    r = officer_client.post("/admin/governance/dataset/register/", {
        "name": "clinic", "upload": SimpleUploadedFile("clinic.csv", csv_bytes), "unit_column": "patient_id",
        "budget_epsilon": "1.5", "budget_delta": "auto", "policy": "rdp",
        "schema": '{"age": {"lower": 18, "upper": 90}}'})
    assert r.status_code == 302, r.content[:2000]
    ds = Dataset.objects.get(name="clinic")
    assert ds.status == "draft" and ds.unit_column == "patient_id" and ds.columns["age"]["upper"] == 90


def test_it_shows_errors_and_writes_nothing_for_a_bad_table(officer_client):
    from django.core.files.uploadedfile import SimpleUploadedFile

    r = officer_client.post("/admin/governance/dataset/register/", {
        "name": "junk", "upload": SimpleUploadedFile("junk.csv", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe"),
        "budget_epsilon": "1", "budget_delta": "auto", "policy": "rdp"})
    assert r.status_code == 200 and b"errornote" in r.content or b"errorlist" in r.content
    assert not Dataset.objects.exists()


def test_an_upload_over_the_limit_is_a_form_error_not_a_500(officer_client, csv_bytes, settings):
    """The officer's upload form: a table over MAX_UPLOAD_BYTES (a 413 on the API) is an
    error on the form, nothing stored."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.MAX_UPLOAD_BYTES = len(csv_bytes) - 1
    before = sorted((settings.DATA_DIR / "datasets").glob("*")) if (settings.DATA_DIR / "datasets").exists() else []
    r = officer_client.post("/admin/governance/dataset/register/", {
        "name": "clinic", "upload": SimpleUploadedFile("clinic.csv", csv_bytes),
        "budget_epsilon": "1", "budget_delta": "auto", "policy": "rdp"})
    assert r.status_code == 200 and b"larger than MAX_UPLOAD_BYTES" in r.content
    assert not Dataset.objects.exists()
    assert sorted((settings.DATA_DIR / "datasets").glob("*")) == before


def test_it_edits_bounds_and_refuses_bad_ones(officer_client, make_dataset):
    ds = make_dataset()
    url = f"/admin/governance/dataset/{ds.pk}/change/"
    schema = ds.schema
    for c in schema["columns"]:
        if c["name"] == "age":
            c["lower"], c["upper"] = 90, 18
    import json

    r = officer_client.post(url, {"title": "t", "description": "", "schema": json.dumps(schema),
                                  "budget_epsilon": "1.0", "budget_delta_text": "auto"})
    assert r.status_code == 200 and b"lower bound 90" in r.content
    ds.refresh_from_db()
    assert ds.columns["age"]["lower"] == 18
    for c in schema["columns"]:
        if c["name"] == "age":
            c["lower"], c["upper"] = 0, 120
    r = officer_client.post(url, {"title": "t", "description": "", "schema": json.dumps(schema),
                                  "budget_epsilon": "2.0", "budget_delta_text": "auto"})
    assert r.status_code == 302
    ds.refresh_from_db()
    assert ds.columns["age"]["upper"] == 120 and ds.budget_epsilon == 2.0


def test_it_grants_and_revokes(officer_client, make_dataset, analyst):
    ds = make_dataset()
    r = officer_client.post("/admin/governance/grant/add/", {"analyst": analyst.pk, "dataset": ds.pk,
                                                             "cap_epsilon": "0.5", "cap_delta": ""})
    assert r.status_code == 302
    g = Grant.objects.get()
    assert g.cap_epsilon == 0.5 and g.active
    officer_client.post("/admin/governance/grant/", {"action": "revoke", "_selected_action": [g.pk]})
    g.refresh_from_db()
    assert not g.active


@pytest.mark.parametrize("field, value", [("cap_epsilon", "-1"), ("cap_epsilon", "0"), ("cap_epsilon", "1e308"),
                                          ("cap_epsilon", "1e-320"), ("cap_epsilon", "nan"), ("cap_delta", "2"),
                                          ("cap_delta", "-0.5"), ("cap_delta", "inf")])
def test_a_grant_form_refuses_the_caps_the_api_refuses(officer_client, make_dataset, analyst, grant, field, value):
    ds = make_dataset()
    r = officer_client.post("/admin/governance/grant/add/", {"analyst": analyst.pk, "dataset": ds.pk, field: value})
    assert r.status_code == 200 and not Grant.objects.exists()  # the form again, with its error
    g = grant(analyst, ds, cap_epsilon=0.5)
    r = officer_client.post(f"/admin/governance/grant/{g.pk}/change/", {"cap_epsilon": "0.5", "cap_delta": "",
                                                                        field: value})
    assert r.status_code == 200
    g.refresh_from_db()
    assert (g.cap_epsilon, g.cap_delta) == (0.5, None)


def _form_as_shown(page: bytes) -> dict:
    """The change form's fields as the officer's browser would send them back unchanged."""
    from html.parser import HTMLParser

    class Form(HTMLParser):
        def __init__(self):
            super().__init__()
            self.data, self.textarea = {}, None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "input" and a.get("name") and a.get("type") not in ("submit", "checkbox"):
                self.data[a["name"]] = a.get("value", "")
            elif tag == "input" and a.get("type") == "checkbox" and "checked" in a:
                self.data[a["name"]] = "on"
            elif tag == "textarea":
                self.textarea = a["name"]
                self.data[self.textarea] = ""

        def handle_data(self, data):
            if self.textarea:
                self.data[self.textarea] += data

        def handle_endtag(self, tag):
            if tag == "textarea":
                self.textarea = None

    f = Form()
    f.feed(page.decode())
    f.data.pop("csrfmiddlewaretoken", None)
    return f.data


def _two_officers_open(url, officer, django_user_model):
    """``officer`` and a second one ("olga") each open ``url``: ((client, form as shown) x 2)."""
    from django.test import Client

    other = django_user_model.objects.create_user("olga", password="x", is_staff=True, is_superuser=True)
    out = []
    for user in (officer, other):
        c = Client()
        c.force_login(user)
        out.append((c, _form_as_shown(c.get(url).content)))
    return out


def test_a_page_saved_after_another_officer_s_edit_keeps_that_edit(client, django_user_model, officer, make_dataset,
                                                                   analyst, grant):
    """A probe's two officers: the second saved a page opened before the first lowered the
    budget and turned allow_non_private off (only the title edited): budget and setting came
    back as they were, recorded as the second officer's deliberate change. Each page sends
    what it showed, and only the fields its officer changed are saved."""
    ds = make_dataset()
    Dataset.objects.filter(pk=ds.pk).update(allow_non_private=True)
    g = grant(analyst, ds, cap_epsilon=0.8)
    url = f"/admin/governance/dataset/{ds.pk}/change/"
    (first, shown_first), (second, shown_second) = _two_officers_open(url, officer, django_user_model)
    assert shown_first["allow_non_private"] == "on" and "initial-budget_epsilon" in shown_first
    first_edit = {**shown_first, "budget_epsilon": "0.6"}
    first_edit.pop("allow_non_private")
    assert first.post(url, first_edit).status_code == 302
    assert second.post(url, {**shown_second, "title": "renamed"}).status_code == 302
    ds.refresh_from_db()
    assert (ds.title, ds.budget_epsilon, ds.allow_non_private) == ("renamed", 0.6, False)
    gurl = f"/admin/governance/grant/{g.pk}/change/"
    shown_first, shown_second = _form_as_shown(first.get(gurl).content), _form_as_shown(second.get(gurl).content)
    assert first.post(gurl, {**shown_first, "cap_epsilon": "0.5"}).status_code == 302
    assert second.post(gurl, {**shown_second, "cap_delta": "1e-7"}).status_code == 302
    g.refresh_from_db()
    assert (g.cap_epsilon, g.cap_delta) == (0.5, 1e-7)


def test_a_schema_saved_from_an_older_page_keeps_another_officer_s_schema_edit(client, django_user_model, officer,
                                                                             make_dataset):
    """A probe's two officers: the first removed a value from a column's domain, the second
    (page opened before) raised another column's bound: the second's save sent the whole
    schema text and put the removed value back, both pages said "changed successfully"."""
    import json

    ds = make_dataset(schema={"age": {"lower": 18, "upper": 90}, "income": {"lower": 0, "upper": 200_000},
                              "site": {"type": "categorical", "domain": ["east", "north", "south"]}})
    url = f"/admin/governance/dataset/{ds.pk}/change/"
    (first, shown_first), (second, shown_second) = _two_officers_open(url, officer, django_user_model)

    def edited(shown, column, **change):
        schema = json.loads(shown["schema"])
        for c in schema["columns"]:
            if c["name"] == column:
                c.update(change)
        return {**shown, "schema": json.dumps(schema)}

    assert first.post(url, edited(shown_first, "site", domain=["east", "north"])).status_code == 302
    assert second.post(url, edited(shown_second, "age", upper=80)).status_code == 302
    ds.refresh_from_db()
    cols = {c["name"]: c for c in ds.schema["columns"]}
    assert cols["site"]["domain"] == ["east", "north"] and cols["age"]["upper"] == 80


def test_a_revoked_grant_is_given_again_from_add_grant(officer_client, make_dataset, analyst, grant):
    """A probe found "Grant with this Analyst and Dataset already exists" for a revoked one
    (the form's unique check came before grants.give could give it again)."""
    from governance.ledger import grants

    ds = make_dataset()
    g = grant(analyst, ds, cap_epsilon=0.5)
    assert grants.revoke(g, analyst)
    r = officer_client.post("/admin/governance/grant/add/", {"analyst": analyst.pk, "dataset": ds.pk,
                                                             "cap_epsilon": "0.3", "cap_delta": "-0"})
    assert r.status_code == 302, r.content.decode()[-2000:]
    g.refresh_from_db()
    assert g.active and (g.cap_epsilon, g.cap_delta) == (0.3, 0.0) and str(g.cap_delta) == "0.0"
    r = officer_client.post("/admin/governance/grant/add/", {"analyst": analyst.pk, "dataset": ds.pk})
    assert r.status_code == 200 and b"already exists" in r.content  # an active one is a duplicate
    assert Grant.objects.count() == 1


def test_a_cap_saved_on_a_grant_revoked_meanwhile_says_so_and_nothing_else(officer_client, make_dataset, analyst,
                                                                            grant):
    from governance.ledger import grants

    g = grant(analyst, make_dataset(), cap_epsilon=0.5)
    url = f"/admin/governance/grant/{g.pk}/change/"
    shown = _form_as_shown(officer_client.get(url).content)
    grants.revoke(g, analyst)
    page = officer_client.post(url, {**shown, "cap_epsilon": "0.2"}, follow=True).content.decode()
    assert "is revoked" in page and "changed successfully" not in page
    g.refresh_from_db()
    assert g.cap_epsilon == 0.5


def test_analysts_cannot_use_the_admin(client, analyst):
    client.force_login(analyst)
    assert client.get("/admin/governance/dataset/").status_code == 302  # to the login page


HOSTILE_JSON = ["[" * 3000 + "]" * 3000, "1" * 5000, '{"age": NaN}', '{"a": 1, "a": 2}']


@pytest.mark.parametrize("text", HOSTILE_JSON)
def test_hostile_json_in_the_officers_forms_is_an_error_not_a_500(officer_client, make_dataset, text):
    ds = make_dataset()
    r = officer_client.post(f"/admin/governance/dataset/{ds.pk}/change/", {
        "title": "t", "description": "", "schema": text, "budget_epsilon": "1.0", "budget_delta_text": "auto"})
    assert r.status_code == 200 and b"not JSON" in r.content
    from django.core.files.uploadedfile import SimpleUploadedFile

    r = officer_client.post("/admin/governance/dataset/register/", {
        "name": "other", "upload": SimpleUploadedFile("t.csv", b"a,b\n1,2\n"), "budget_epsilon": "1",
        "budget_delta": "auto", "policy": "rdp", "schema": text})
    assert r.status_code == 200 and b"not JSON" in r.content
    for what in ("event", "request", "sql"):
        args = {"what": what, "event": text} if what != "sql" else {"what": "sql", "event": "SELECT COUNT(*) FROM t",
                                                                      "options": text}
        r = officer_client.get(f"/admin/governance/dataset/{ds.pk}/overview/", args)
        assert r.status_code == 200 and b"not JSON" in r.content, what


def test_the_estimate_tool_refuses_a_request_of_the_wrong_shape(officer_client, make_dataset):
    ds = make_dataset()
    r = officer_client.get(f"/admin/governance/dataset/{ds.pk}/overview/",
                           {"what": "request", "event": '{"engine": ["a"], "kind": {"b": 1}}'})
    assert r.status_code == 200 and b"engine and kind (strings)" in r.content


@pytest.mark.parametrize("who", ["1" * 5000, "\u0663", "-1", ""])
def test_the_token_page_refuses_a_user_id_that_is_not_one(officer_client, who):
    r = officer_client.post("/admin/governance/token/", {"for": who})
    assert r.status_code == 400


def test_a_budget_edit_the_ledger_refuses_says_so_and_nothing_else(officer_client, make_dataset, officer):
    """The budget is checked against what is spent under the ledger's lock (at save, not
    in the form): the page shows that error, not "changed successfully", and the
    dataset's history records no change."""
    import json

    from django.contrib.admin.models import LogEntry

    from governance.ledger import actions as ledger

    ds = make_dataset()
    ledger.commit(ledger.admit(ds, officer, {"kind": "laplace", "epsilon": 0.5}))
    url = f"/admin/governance/dataset/{ds.pk}/change/"
    r = officer_client.post(url, {"title": "t", "description": "", "schema": json.dumps(ds.schema),
                                  "budget_epsilon": "0.1", "budget_delta_text": "auto"}, follow=True)
    page = r.content.decode()
    assert r.status_code == 200 and "below what the ledger has already spent" in page
    assert "changed successfully" not in page
    ds.refresh_from_db()
    assert ds.budget_epsilon == 1.0 and not LogEntry.objects.filter(object_id=str(ds.pk)).exists()


def test_a_full_disk_on_the_officer_s_forms_is_a_507_page_not_a_500(officer_client, officer, analyst, csv_bytes,
                                                                    make_dataset, monkeypatch, settings):
    """The register form's copy of the table finds the disk full, and a grant's save finds
    the database full: each a 507 page saying so, nothing kept (was Django's 500 page, with
    its traceback under DEBUG)."""
    import errno
    import os

    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.db import OperationalError

    from governance.datasets import files as dataset_files

    officer_client.raise_request_exception = False
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    with monkeypatch.context() as m:
        m.setattr(dataset_files.os, "fdopen", lambda fd, mode="r", *a, **kw: Full(real_fdopen(fd, mode)))
        r = officer_client.post("/admin/governance/dataset/register/", {
            "name": "clinic", "upload": SimpleUploadedFile("clinic.csv", csv_bytes), "budget_epsilon": "1.5",
            "budget_delta": "auto", "policy": "rdp"})
    assert r.status_code == 507 and b"No space left on device" in r.content and b"Traceback" not in r.content
    assert not Dataset.objects.filter(name="clinic").exists()
    r = _grant_form_raising(OperationalError("database or disk is full"), officer_client, analyst, make_dataset,
                            monkeypatch)
    assert r.status_code == 507 and b"the database has no space left" in r.content
    assert not Grant.objects.exists()


def _grant_form_raising(error, officer_client, analyst, make_dataset, monkeypatch):
    from governance.ledger import grants

    def fail(*args, **kwargs):
        raise error

    ds = make_dataset("other")
    monkeypatch.setattr(grants, "give", fail)
    return officer_client.post("/admin/governance/grant/add/", {"analyst": analyst.pk, "dataset": ds.pk,
                                                                "cap_epsilon": "0.5", "cap_delta": ""})


def test_a_database_error_on_the_officer_s_forms_is_a_503_page_not_a_500(officer_client, analyst, make_dataset,
                                                                          monkeypatch):
    """A probe's revoke beside an analyst's cancels: PostgreSQL broke a deadlock by failing the
    admin's action, which answered Django's 500 page; the API said 503 database.unavailable."""
    from django.db import OperationalError

    from governance.models import Grant

    r = _grant_form_raising(OperationalError("deadlock detected"), officer_client, analyst, make_dataset, monkeypatch)
    assert r.status_code == 503 and r["Retry-After"] == "5" and b"Nothing was kept" in r.content
    assert b"Traceback" not in r.content and not Grant.objects.exists()


def test_directional_characters_an_analyst_sent_are_shown_escaped_to_the_officer_and_the_auditor(
        client, officer, analyst, api, make_dataset, grant, django_capture_on_commit_callbacks):
    """U+202E in a select alias made the officer's request page read the params right to
    left ('{"epsilon": 0.25}' as "52.0"); the CSV export's params cell too. Shown as the
    escape \\u202e: in the CSV's JSON cell the same value."""
    import csv
    import io
    import json

    from governance.models import AuditRecord, Request

    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    params = {"select": [{"name": "n\u202e\u2066", "agg": "count"}], "epsilon": 0.25}
    with django_capture_on_commit_callbacks(execute=True):
        r = api(analyst).post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "query",
                                                 "params": params}, format="json")
    assert r.status_code == 202, r.content
    req = Request.objects.get(pk=r.json()["id"])
    client.force_login(officer)
    record = AuditRecord.objects.get(request_id=req.pk)
    for url in (f"/admin/governance/request/{req.pk}/change/", "/admin/governance/auditrecord/",
                f"/admin/governance/auditrecord/{record.pk}/change/"):
        page = client.get(url).content.decode()
        assert "\u202e" not in page and "\u2066" not in page, url
    assert "\\u202e" in client.get(f"/admin/governance/request/{req.pk}/change/").content.decode()
    export = api(officer).get("/api/audit/export/", {"dataset": ds.name, "format": "csv"}).getvalue().decode()
    assert "\u202e" not in export
    cells = [row["params"] for row in csv.DictReader(io.StringIO(export)) if "select" in row["params"]]
    assert cells and json.loads(cells[0])["select"][0]["name"] == "n\u202e\u2066"


def test_the_requests_page_filters_on_its_own_filters_only_never_on_a_result(officer_client, make_dataset, analyst):
    """Django allows a lookup on any local field from the query string: a probe read an
    analyst's released mean, which officers never see, digit by digit with
    ``?result__icontains="value": 4...`` (one row listed or none)."""
    from governance.models import Request

    ds = make_dataset("clinic")
    req = Request.objects.create(analyst=analyst, dataset=ds, engine="aggregates", kind="mean", params={},
                                 plan={}, status=Request.Status.SUCCEEDED, result={"value": 47847.33},
                                 result_salt="0123456789abcdef")
    page = "/admin/governance/request/"
    for lookup in ({"result__icontains": '"value": 4'}, {"result__value__gt": "1"}, {"result_salt__startswith": "0"},
                   {"params__icontains": "x"}, {"analyst__password__startswith": "p"}):
        r = officer_client.get(page, lookup)
        assert r.status_code == 400, (lookup, r.status_code)  # Django's DisallowedModelAdminLookup
    # the page's own filters still work
    for lookup in ({"status__exact": "succeeded"}, {"engine__exact": "aggregates"}, {"dataset__id__exact": ds.pk}):
        r = officer_client.get(page, lookup)
        assert r.status_code == 200 and str(req.pk) in r.content.decode(), lookup
    assert officer_client.get("/admin/governance/auditrecord/", {"outcome__exact": "ok"}).status_code == 200
    assert officer_client.get("/admin/governance/auditrecord/", {"hash__startswith": "0"}).status_code == 400


def test_an_account_s_username_cannot_be_changed_in_the_admin(client, django_user_model, analyst, make_dataset, grant):
    """A rename in Django's user admin made every dataset the analyst had used fail
    ``audit verify`` (its records name her by the old username)."""
    from governance.audit.verification import verify

    ds = make_dataset("clinic")
    grant(analyst, ds)
    ledger.commit(ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.1}).pk)
    root = django_user_model.objects.create_superuser("root", "root@example.org", "pw")
    client.force_login(root)
    page = client.get(f"/admin/auth/user/{analyst.pk}/change/").content.decode()
    assert 'name="username"' not in page  # shown, not editable
    form = {"username": "ann2", "first_name": "", "last_name": "", "email": "", "is_active": "on",
            "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00", "initial-date_joined_0": "2026-01-01",
            "initial-date_joined_1": "00:00:00"}
    client.post(f"/admin/auth/user/{analyst.pk}/change/", form)
    analyst.refresh_from_db()
    assert analyst.username == "ann" and verify([ds]).ok


@pytest.fixture
def root_client(client, django_user_model):
    """An officer with Django's permissions on accounts (``manage.py createofficer``'s)."""
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.org", "pw"))
    return client


@pytest.mark.parametrize("username, created", [("\u0430lice", False), ("ALICE", False), ("al ice", False),
                                                ("bob.smith+1", True)])
def test_a_new_account_in_the_admin_follows_the_api_s_username_rule(root_client, django_user_model, username,
                                                                    created):
    """Django's add form took "аlice" (a Cyrillic а), whose releases an auditor read as
    alice's: the admin now holds new accounts to the API's rule (ASCII, unique ignoring
    case)."""
    django_user_model.objects.create_user("alice")
    r = root_client.post("/admin/auth/user/add/", {"username": username, "usable_password": "false",
                                                   "password1": "", "password2": ""})
    assert django_user_model.objects.filter(username=username).exists() is created, r.content.decode()[-2000:]
    if not created:
        assert r.status_code == 200 and "errorlist" in r.content.decode()


def test_an_account_with_active_grants_is_not_made_an_auditor(root_client, make_dataset, analyst, grant):
    """Added to the auditors group in the user admin, an analyst kept her grants: she ran
    requests and read every analyst's in the audit trail. The form refuses; an account
    already in both (a change made outside the admin) uses no dataset."""
    from django.contrib.auth.models import Group

    from governance.core.roles import AUDITORS_GROUP

    ds = make_dataset("clinic")
    grant(analyst, ds)
    auditors = Group.objects.get_or_create(name=AUDITORS_GROUP)[0]
    form = {"first_name": "", "last_name": "", "email": "", "is_active": "on", "groups": [auditors.pk],
            "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00", "initial-date_joined_0": "2026-01-01",
            "initial-date_joined_1": "00:00:00"}
    r = root_client.post(f"/admin/auth/user/{analyst.pk}/change/", form)
    assert r.status_code == 200 and "holds active grants" in r.content.decode()
    assert not analyst.groups.exists()
    Grant.objects.filter(analyst=analyst).update(revoked_at="2026-01-02T00:00:00Z")
    r = root_client.post(f"/admin/auth/user/{analyst.pk}/change/", form)
    assert r.status_code == 302 and analyst.groups.filter(pk=auditors.pk).exists()


@pytest.mark.django_db
def test_an_auditor_holding_a_grant_from_before_uses_no_dataset(api, make_dataset, analyst, analyst2, grant):
    from django.contrib.auth.models import Group

    from governance.core.roles import AUDITORS_GROUP
    from governance.requests.submission import access_refusal

    ds = make_dataset("clinic", epsilon=5.0)
    grant(analyst, ds)
    grant(analyst2, ds)
    client = api(analyst)
    assert client.get("/api/datasets/clinic/").status_code == 200
    analyst.groups.add(Group.objects.get_or_create(name=AUDITORS_GROUP)[0])  # (outside the admin's form)
    assert api(analyst2).get("/api/datasets/").json()["results"][0]["name"] == "clinic"  # others still see it
    client = api(analyst)
    r = client.post("/api/requests/", {"dataset": "clinic", "engine": "aggregates", "kind": "count",
                                       "params": {"epsilon": 0.1}}, format="json")
    assert r.status_code == 400 and r.json()["errors"] == {"dataset": "not found"}, r.content
    assert client.get("/api/datasets/clinic/").status_code == 404
    assert access_refusal(analyst, ds).code == "grant.missing"  # a request queued before: refused at its run


def test_an_analyst_made_an_auditor_sees_none_of_her_requests_results_ledger_or_grants(
        api, make_dataset, analyst, grant, django_capture_on_commit_callbacks):
    """A probe revoked an analyst's grant and made her an auditor: she still read her
    request and its result, the list of her requests and her ledger entries, where the docs
    say an auditor sees "no results, no requests"."""
    from django.contrib.auth.models import Group

    from governance.core.roles import AUDITORS_GROUP
    from governance.ledger import grants

    ds = make_dataset("clinic", epsilon=5.0)
    g = grant(analyst, ds)
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post("/api/requests/", {"dataset": "clinic", "engine": "aggregates", "kind": "count",
                                           "params": {"epsilon": 0.1}}, format="json")
    rid = r.json()["id"]
    assert client.get(f"/api/requests/{rid}/").json()["result"] is not None
    assert grants.revoke(g, analyst)
    analyst.groups.add(Group.objects.get_or_create(name=AUDITORS_GROUP)[0])
    client = api(analyst)
    assert client.get(f"/api/requests/{rid}/").status_code == 404
    assert client.get(f"/api/requests/{rid}/?wait=1").status_code == 404
    for url in ("/api/requests/", "/api/ledger/", "/api/grants/"):
        assert client.get(url).json()["results"] == [], url
    assert client.get("/api/audit/").status_code == 200  # what an auditor reads


def test_an_account_an_audit_record_names_is_not_deleted(root_client, make_dataset, analyst, django_user_model):
    """Deleted, its username could be given to a new account, and the trail would credit the
    new one with what it records (a probe's deleted officer's budget change, read back as an
    analyst's). Such an account is deactivated; one no record names can still be deleted."""
    from governance.datasets import registry
    from governance.models import AuditRecord

    ds = make_dataset("clinic", epsilon=5.0)
    named = django_user_model.objects.create_user("off2", is_staff=True)
    other = django_user_model.objects.create_user("temp")
    registry.update(ds, budget_epsilon=5.5, actor="off2")
    assert AuditRecord.objects.filter(actor="off2", action="settings").exists()
    assert root_client.get(f"/admin/auth/user/{named.pk}/delete/").status_code == 403
    bulk = {"action": "delete_selected", "_selected_action": [named.pk, other.pk], "post": "yes"}
    assert root_client.post("/admin/auth/user/", bulk).status_code == 403
    assert django_user_model.objects.filter(pk__in=[named.pk, other.pk]).count() == 2
    assert root_client.post("/admin/auth/user/", {**bulk, "_selected_action": [other.pk]}).status_code == 302
    assert django_user_model.objects.filter(pk=named.pk).exists() and not django_user_model.objects.filter(
        pk=other.pk).exists()


def test_a_token_an_officer_issues_for_an_analyst_is_in_the_admin_s_log(officer_client, api, officer, analyst):
    """With it the officer could act as her (docs/concepts.md): the step is on record."""
    from django.contrib.admin.models import LogEntry

    assert api(officer).post(f"/api/analysts/{analyst.pk}/token/").status_code == 200
    assert officer_client.post("/admin/governance/token/", {"for": str(analyst.pk)}).status_code == 200
    logged = LogEntry.objects.filter(object_id=str(analyst.pk), user=officer)
    assert [e.change_message for e in logged] == ["Issued a new API token (the old one stopped working)."] * 2


def test_every_list_in_the_admin_checks_a_bulk_actions_selection():
    from django.contrib import admin

    from governance.web.admin import SelectedIds

    assert all(isinstance(model_admin, SelectedIds) for model_admin in admin.site._registry.values())


@pytest.mark.parametrize("selected", ["abc", "1.5", "", "99999999999999999999"])
@pytest.mark.parametrize("url, action", [("/admin/governance/grant/", "revoke"),
                                         ("/admin/governance/dataset/", "deactivate"),
                                         ("/admin/auth/user/", "delete_selected"),
                                         ("/admin/auth/group/", "delete_selected")])
def test_a_bulk_action_on_what_is_not_an_id_is_a_400(root_client, make_dataset, analyst, grant, url, action,
                                                     selected):
    """An edited POST (a probe: Django's filter on the selection raised, a 500 with the
    traceback page under DEBUG); nothing changes."""
    ds = make_dataset()
    g = grant(analyst, ds)
    r = root_client.post(url, {"action": action, "_selected_action": [selected], "index": "0", "post": "yes"})
    assert r.status_code == 400 and b"not an id" in r.content
    g.refresh_from_db()
    ds.refresh_from_db()
    assert g.active and ds.status == "active"


def test_an_officer_who_charged_without_a_grant_stays_staff(root_client, make_dataset, django_user_model):
    """Un-ticking the staff status of an officer who recorded an external charge made every
    later ``audit verify`` fail (a grant-less charge is an officer's); the form refuses, and
    deactivating the account keeps the chain verifiable."""
    from governance.audit.verification import verify

    ds = make_dataset(epsilon=5.0)
    olga = django_user_model.objects.create_user("olga", is_staff=True)
    ledger.commit(ledger.admit(ds, olga, {"kind": "laplace", "epsilon": 0.5}, reference="paper"))
    assert verify().ok
    url = f"/admin/auth/user/{olga.pk}/change/"
    page = root_client.get(url)
    assert page.status_code == 200
    form = {"username": "olga", "is_active": "on", "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00",
            "initial-date_joined_0": "2026-01-01", "initial-date_joined_1": "00:00:00"}
    r = root_client.post(url, form)  # is_staff left out: un-ticked
    assert r.status_code == 200 and b"Deactivate it instead" in r.content
    olga.refresh_from_db()
    assert olga.is_staff and verify().ok
    r = root_client.post(url, {**form, "is_staff": "on", "is_active": ""})  # deactivated instead
    assert r.status_code == 302
    olga.refresh_from_db()
    assert olga.is_staff and not olga.is_active and verify().ok


@pytest.mark.parametrize("username", ["\u0430lice", "ALICE"])
def test_createsuperuser_follows_the_username_rule(django_user_model, username):
    """``manage.py createsuperuser`` (how the docs make an officer) took a Cyrillic "аlice"
    and an "ALICE" beside "alice" (a probe): the rule is the username field's own now."""
    import io

    from django.core.management import CommandError, call_command

    django_user_model.objects.create_user("alice")
    with pytest.raises(CommandError, match="ASCII|ignoring case"):
        call_command("createsuperuser", "--noinput", "--username", username, "--email", "a@example.org",
                     stdout=io.StringIO(), stderr=io.StringIO())
    assert not django_user_model.objects.filter(username=username).exists()
    call_command("createsuperuser", "--noinput", "--username", "bob", "--email", "b@example.org",
                 stdout=io.StringIO())
    assert django_user_model.objects.filter(username="bob", is_superuser=True).exists()


def test_schema_edits_sends_the_changed_fields_and_a_retyped_column_whole():
    from governance.web.admin_forms import schema_edits

    shown = {"columns": [{"name": "a", "type": "numeric", "lower": 0, "upper": 9},
                         {"name": "b", "type": "categorical", "domain": ["x", "y"]}]}
    sent = {"columns": [{"name": "a", "type": "numeric", "lower": 0, "upper": 5},
                        {"name": "b", "type": "numeric", "lower": 0, "upper": 1}]}
    assert schema_edits(shown, sent) == {"columns": [{"name": "a", "upper": 5},
                                                     {"name": "b", "type": "numeric", "lower": 0, "upper": 1}]}
    assert schema_edits(shown, shown) == {"columns": []}
    assert schema_edits(None, sent) == sent and schema_edits(shown, "not a schema") == "not a schema"


@pytest.mark.parametrize("field, text", [("budget_epsilon", "1_5"), ("budget_epsilon", "\uff12\uff10"),
                                         ("approx_delta_share", "0.0_5"), ("release_quantum_ms", "1_0"),
                                         ("release_quantum_ms", "\u0663")])
def test_the_dataset_form_refuses_numbers_that_are_not_plain(officer_client, make_dataset, field, text):
    """The edit form's budget read "1_5" as 15 and "２０" as 20 and saved them (a probe), where
    the register form, the grant form and the API refuse them."""
    ds = make_dataset()
    before = (ds.budget_epsilon, ds.approx_delta_share, ds.release_quantum_ms)
    form = {"title": ds.title, "description": "", "schema": json.dumps(ds.schema), "budget_epsilon": "1.0",
            "budget_delta_text": "auto", "approx_delta_share": str(ds.approx_delta_share),
            "release_quantum_ms": str(ds.release_quantum_ms), field: text}
    r = officer_client.post(f"/admin/governance/dataset/{ds.pk}/change/", form)
    assert r.status_code == 200 and (b"plain decimal" in r.content or b"ASCII digits" in r.content), r.content[:300]
    ds.refresh_from_db()
    assert (ds.budget_epsilon, ds.approx_delta_share, ds.release_quantum_ms) == before
