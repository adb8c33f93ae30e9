"""The web pages of issue 26: a token page for analysts, auditors and officers (a new
token shown once, the old one dead at once), the auditor's own pages (every chain, a
dataset's trail with filters and paging, verification, exports), and the officer's
estimate tool taking a request or SQL as well as an event. Django test client; the same
pages in Chromium: tests/browser/test_web_tokens_auditor.py."""

import json

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from governance.models import AuditRecord
from tests.audit.conftest import build_history, tamperer  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def survey(make_dataset, grant, analyst, analyst2):
    ds = make_dataset("survey", epsilon=3.0)
    grant(analyst, ds, cap_epsilon=1.5)
    grant(analyst2, ds)
    build_history(ds, [analyst, analyst2], n=60)
    return ds


def sign_in(client, user):
    """The token sign-in an analyst or auditor does (POST /analyst/login/)."""
    key = Token.objects.get_or_create(user=user)[0].key
    r = client.post("/analyst/login/", {"token": key})
    assert r.status_code == 302
    return key, r["Location"]


def api_status(api_client, key):
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return api_client.get("/api/me/").status_code


# --------------------------------------------------------------------------- tokens


@pytest.mark.parametrize("who", ["analyst", "auditor"])
def test_an_analyst_or_auditor_issues_themselves_a_new_token_shown_once(client, request, who):
    from rest_framework.test import APIClient

    user = request.getfixturevalue(who)
    old, home = sign_in(client, user)
    assert home == ("/auditor/" if who == "auditor" else "/analyst/")
    page = client.get(home).content.decode()
    assert 'id="token-card"' in page and old not in page  # the key itself is never shown again
    r = client.post("/analyst/token/")
    new = Token.objects.get(user=user).key
    assert r.status_code == 200 and new != old and new in r.content.decode()
    assert api_status(APIClient(), old) == 401 and api_status(APIClient(), new) == 200
    assert client.get(home).status_code == 200  # still signed in, on the new token
    assert new not in client.get(home).content.decode()


def test_a_session_opened_with_a_token_never_opens_the_admin_even_made_staff(client, analyst):
    """Signed in with her token, then made staff (the admin's user form): the same cookie
    opened /admin/ and its pages, to whoever held the token (probe CO). A password sign-in
    of the same account opens it."""
    sign_in(client, analyst)
    type(analyst).objects.filter(pk=analyst.pk).update(is_staff=True)
    for path in ("/admin/", "/admin/governance/dataset/"):
        r = client.get(path)
        assert r.status_code == 302 and "/login/" in r["Location"], (path, r.status_code)
    analyst.refresh_from_db()
    analyst.set_password("a-long-pass-phrase-1")
    analyst.save()
    assert client.login(username=analyst.username, password="a-long-pass-phrase-1")
    assert client.get("/admin/").status_code == 200


def test_the_token_button_needs_a_post_and_a_session(client, analyst):
    assert client.post("/analyst/token/")["Location"].startswith("/analyst/login/")
    sign_in(client, analyst)
    assert client.get("/analyst/token/").status_code == 405


def test_the_officer_issues_tokens_for_an_analyst_and_for_themselves(client, officer, analyst, auditor):
    from rest_framework.test import APIClient

    old = Token.objects.create(user=analyst).key
    analyst_web = client.__class__()
    sign_in(analyst_web, analyst)
    client.force_login(officer)
    page = client.get("/admin/governance/token/").content.decode()
    assert "ann" in page and "audrey" in page and old not in page
    assert "/admin/governance/token/" in client.get("/admin/").content.decode()  # linked from the dashboard
    r = client.post("/admin/governance/token/", {"for": analyst.pk})
    new = Token.objects.get(user=analyst).key
    assert r.status_code == 200 and new in r.content.decode() and new != old
    assert api_status(APIClient(), old) == 401 and api_status(APIClient(), new) == 200
    assert analyst_web.get("/analyst/")["Location"].startswith("/analyst/login/")  # its session ended too
    r = client.post("/admin/governance/token/", {"for": "me"})
    mine = Token.objects.get(user=officer).key
    assert mine in r.content.decode() and api_status(APIClient(), mine) == 200
    assert client.get("/admin/").status_code == 200  # the officer's password session goes on


def test_the_officer_token_page_refuses_others(client, officer, analyst):
    client.force_login(officer)
    assert client.post("/admin/governance/token/", {"for": officer.pk}).status_code == 404  # staff: not here
    assert client.post("/admin/governance/token/", {"for": "nope"}).status_code == 400
    client.force_login(analyst)
    assert client.get("/admin/governance/token/")["Location"].startswith("/admin/login/")


# --------------------------------------------------------------------------- the auditor's pages


def test_the_auditor_sees_every_chain_with_verify_and_export_links(client, auditor, survey):
    sign_in(client, auditor)
    html = client.get("/auditor/").content.decode()
    assert "survey" in html and str(survey.budget.audit_seq) in html
    assert "/auditor/verify/?dataset=survey" in html and "/auditor/export/?dataset=survey&amp;format=pdf" in html


def test_the_trail_filters_and_pages_keep_the_filters(client, auditor, make_dataset, grant, analyst):
    survey = make_dataset("survey", epsilon=1000.0)
    grant(analyst, survey)
    build_history(survey, [analyst], n=90)
    sign_in(client, auditor)
    commits = AuditRecord.objects.filter(dataset=survey, action="commit").count()
    assert commits > 50  # two pages
    html = client.get("/auditor/datasets/survey/?action=commit").content.decode()
    assert html.count("<td>commit</td>") == 50 and "<td>release</td>" not in html
    assert "?action=commit&amp;page=2" in html  # the next page keeps the filter
    second = client.get("/auditor/datasets/survey/?action=commit&page=2").content.decode()
    assert second.count("<td>commit</td>") == commits - 50
    assert client.get("/auditor/datasets/nope/").status_code == 404


def test_verification_says_ok_and_then_names_the_edited_record(client, auditor, survey, tamperer):  # noqa: F811
    sign_in(client, auditor)
    ok = client.get("/auditor/verify/?dataset=survey").content.decode()
    assert "<strong>OK</strong>" in ok and "survey" in ok
    rec = AuditRecord.objects.get(dataset=survey, seq=7)
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {AuditRecord._meta.db_table} SET params = %s WHERE id = %s",
                    [json.dumps({**(rec.params or {}), "column": "agf"}), rec.pk])
    broken = client.get("/auditor/verify/").content.decode()
    assert "<strong>BROKEN</strong>" in broken and "record 7" in broken
    assert client.get("/auditor/verify/?dataset=nope").status_code == 404


@pytest.mark.parametrize("fmt, kind", [("pdf", "application/pdf"), ("json", "application/json"), ("csv", "text/csv")])
def test_the_auditor_exports(client, auditor, survey, fmt, kind):
    sign_in(client, auditor)
    r = client.get(f"/auditor/export/?dataset=survey&format={fmt}")
    assert r.status_code == 200 and r["Content-Type"].startswith(kind)
    assert client.get("/auditor/export/?dataset=survey&format=xml").status_code == 400
    assert client.get("/auditor/export/?dataset=nope&format=json").status_code == 404


@pytest.mark.parametrize("path", ["/auditor/", "/auditor/datasets/survey/", "/auditor/verify/",
                                  "/auditor/export/?dataset=survey&format=json"])
def test_analysts_are_refused_and_strangers_sent_to_sign_in(client, analyst, survey, path):
    assert client.get(path)["Location"].startswith("/analyst/login/")
    sign_in(client, analyst)
    assert client.get(path).status_code == 403


# --------------------------------------------------------------------------- the estimate tool


@pytest.fixture
def officer_client(client, officer):
    client.force_login(officer)
    return client


def estimate(officer_client, ds, **query):
    r = officer_client.get(f"/admin/governance/dataset/{ds.pk}/overview/", query)
    assert r.status_code == 200
    return r.content.decode()


def test_the_estimate_tool_takes_sql_and_a_request(officer_client, survey):
    html = estimate(officer_client, survey, what="sql", event='SELECT COUNT(*) FROM "survey"',
                    options='{"epsilon": 0.05}')
    assert 'id="estimate-result"' in html and 'id="estimate-request"' in html and "aggregates / count" in html
    html = estimate(officer_client, survey, what="request",
                    event='{"engine": "aggregates", "kind": "mean", "params": {"column": "income", "epsilon": 0.05}}')
    assert 'id="estimate-result"' in html and "aggregates / mean" in html
    html = estimate(officer_client, survey, what="sql")  # nothing asked yet: an example for this dataset
    assert 'FROM &quot;survey&quot;' in html and 'id="estimate-result"' not in html


@pytest.mark.parametrize("what, text, options, says", [
    ("sql", 'SELECT COUNT(*) FROM "survey" WHERE site = \'atlantis\'', '{"epsilon": 0.1}', "atlantis"),
    ("sql", "SELEC nonsense", '{"epsilon": 0.1}', "sql"),
    ("sql", 'SELECT COUNT(*) FROM "survey"', "not json", "not JSON"),
    ("request", '{"engine": "aggregates", "kind": "count", "params": {"epsilon": -1}}', "", "epsilon"),
    ("request", "[1, 2]", "", "a request is a JSON object"),
    ("event", '{"kind": "laplace"}', "", "epsilon"),
])
def test_the_estimate_tool_shows_what_is_wrong(officer_client, survey, what, text, options, says):
    html = estimate(officer_client, survey, what=what, event=text, options=options)
    assert 'id="estimate-error"' in html and says.lower() in html.lower() and 'id="estimate-result"' not in html


def test_drf_create_token_from_a_shell_issues_once_and_its_reset_ends_the_old_sessions(client, analyst):
    """A probe: DRF's own command printed the analyst's live token again (tokens are shown
    once), and with -r left the web session opened with the old token signed in, where it
    issued itself a new token and locked the officer's out."""
    import io

    from django.core.management import CommandError, call_command
    from rest_framework.test import APIClient

    old, home = sign_in(client, analyst)
    assert client.get(home).status_code == 200
    with pytest.raises(CommandError, match="already has a token"):
        call_command("drf_create_token", analyst.username, stdout=io.StringIO())
    out = io.StringIO()
    call_command("drf_create_token", analyst.username, "-r", stdout=out)
    new = out.getvalue().split()[2]
    assert new != old and api_status(APIClient(), old) == 401 and api_status(APIClient(), new) == 200
    assert client.get(home).status_code == 302  # the old token's session ended: to the sign-in page
    with pytest.raises(CommandError, match="does not exist"):
        call_command("drf_create_token", "nobody", stdout=io.StringIO())
