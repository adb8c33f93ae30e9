"""The officer's web UI (server-rendered, Django test client): dashboard, dataset page,
estimate tool, filters and exports; analysts and auditors are kept out. The same pages
are driven in Chromium by tests/browser."""

import pytest

from governance.models import AuditRecord
from tests.audit.conftest import build_history

pytestmark = pytest.mark.django_db


@pytest.fixture
def survey(make_dataset, grant, analyst, analyst2):
    ds = make_dataset("survey", epsilon=3.0)
    grant(analyst, ds, cap_epsilon=1.5)
    grant(analyst2, ds)
    build_history(ds, [analyst, analyst2])
    return ds


@pytest.fixture
def officer_client(client, officer):
    client.force_login(officer)
    return client


def test_dashboard_shows_every_dataset_with_gauge_and_burndown(officer_client, survey, make_dataset):
    make_dataset("empty-one", epsilon=1.0)
    r = officer_client.get("/admin/")
    html = r.content.decode()
    assert r.status_code == 200
    assert "survey" in html and "empty-one" in html
    assert html.count('class="gauge"') == 2 and html.count('class="burndown"') == 2
    assert f"/admin/governance/dataset/{survey.pk}/overview/" in html


def test_dataset_page_has_gauges_chart_grants_ledger_and_audit(officer_client, survey):
    r = officer_client.get(f"/admin/governance/dataset/{survey.pk}/overview/")
    html = r.content.decode()
    assert r.status_code == 200
    assert html.count('class="gauge"') == 3 and "<polyline" in html and "cap 3" in html
    assert "ann" in html and "bob" in html and 'id="ledger"' in html and 'id="audit"' in html
    assert "format=pdf" in html and "format=json" in html and "format=csv" in html


def test_audit_filter(officer_client, survey):
    r = officer_client.get(f"/admin/governance/dataset/{survey.pk}/overview/", {"action": "refuse"})
    audit_table = r.content.decode().split('id="audit"')[1].split("</table>")[0]
    n = AuditRecord.objects.filter(dataset=survey, action="refuse").count()
    assert audit_table.count("<td>refuse</td>") == min(n, 25) and "<td>commit</td>" not in audit_table


def test_estimate_tool(officer_client, survey):
    url = f"/admin/governance/dataset/{survey.pk}/overview/"
    html = officer_client.get(url, {"event": '{"kind": "laplace", "epsilon": 0.01}'}).content.decode()
    assert 'id="estimate-result"' in html and "Would be admitted now" in html
    html = officer_client.get(url, {"event": '{"kind": "laplace"}'}).content.decode()
    assert 'id="estimate-error"' in html
    html = officer_client.get(url, {"event": "{not json"}).content.decode()
    assert "not JSON" in html


@pytest.mark.parametrize("fmt,ctype", [("json", "application/json"), ("csv", "text/csv; charset=utf-8"),
                                       ("pdf", "application/pdf")])
def test_export_buttons(officer_client, survey, fmt, ctype):
    r = officer_client.get("/admin/governance/audit/export/", {"dataset": survey.name, "format": fmt})
    assert r.status_code == 200 and r["Content-Type"] == ctype


def test_verify_button_reports(officer_client, survey):
    r = officer_client.get("/admin/governance/audit/verify/", {"dataset": survey.name}, follow=True)
    assert "Audit chain verified" in r.content.decode()


def test_requests_and_audit_records_are_listed_read_only(officer_client, survey):
    assert officer_client.get("/admin/governance/request/").status_code == 200
    r = officer_client.get("/admin/governance/auditrecord/")
    assert r.status_code == 200 and "survey" in r.content.decode()
    rec = AuditRecord.objects.first()
    r = officer_client.post(f"/admin/governance/auditrecord/{rec.pk}/change/", {"actor": "x"})
    assert r.status_code == 403


@pytest.mark.parametrize("who", ["analyst", "auditor"])
def test_non_officers_are_sent_to_the_login(client, survey, analyst, django_user_model, who):
    from django.contrib.auth.models import Group

    from governance.core import roles

    user = analyst
    if who == "auditor":
        user = django_user_model.objects.create_user("audrey")
        user.groups.add(Group.objects.get_or_create(name=roles.AUDITORS_GROUP)[0])
    client.force_login(user)
    for url in ("/admin/", f"/admin/governance/dataset/{survey.pk}/overview/",
                f"/admin/governance/audit/export/?dataset={survey.name}&format=json"):
        r = client.get(url)
        assert r.status_code == 302 and "/admin/login/" in r["Location"], url


def test_the_analyst_page_after_a_token_sign_in(client, survey, analyst, analyst2):
    from rest_framework.authtoken.models import Token

    from governance.models import Request

    assert client.get("/analyst/").status_code == 302
    r = client.post("/analyst/login/", {"token": "nope"})
    assert r.status_code == 200 and "Unknown token" in r.content.decode()
    Request.objects.create(analyst=analyst2, dataset=survey, engine="aggregates", kind="count", params={},
                           fingerprint="x", plan={}, status="succeeded")
    r = client.post("/analyst/login/", {"token": Token.objects.create(user=analyst).key}, follow=True)
    html = r.content.decode()
    assert r.status_code == 200 and "survey" in html and "No requests yet" in html  # bob's is not shown
    table = html.split('id="my-datasets"')[1].split("</table>")[0]
    assert "1.5" in table  # ann's cap
    r = client.post("/analyst/logout/")
    assert r.status_code == 302 and client.get("/analyst/").status_code == 302


def test_verify_does_not_redirect_off_site(officer_client, survey):
    r = officer_client.get("/admin/governance/audit/verify/", {"next": "//evil.example/x"})
    assert r.status_code == 302 and r["Location"] == "/admin/"


def _links(html: str, section: str) -> dict[str, str]:
    """The pager links ("previous", "next") after the table ``section``."""
    import html as html_lib
    import re

    part = html.split(f'id="{section}"')[1].split("</table>")[1].split("</p>")[0]
    return {text: html_lib.unescape(href) for href, text in re.findall(r'<a href="([^"]*)">(\w+)</a>', part)}


def test_paging_a_filtered_list_keeps_every_filter_and_the_other_page(officer_client, survey, analyst):
    """Issue 22: the pager's links were ``?apage=2``: paging the filtered audit trail (or
    ledger) dropped its filters, the other list's filters and the other list's page."""
    from urllib.parse import parse_qs, urlsplit

    from governance.ledger import actions as ledger

    for _ in range(60):  # > 2 pages of committed entries and of commit records
        ledger.commit(ledger.admit(survey, analyst, {"kind": "laplace", "epsilon": 0.001}))
    url = f"/admin/governance/dataset/{survey.pk}/overview/"
    filters = {"action": "commit", "actor": analyst.username, "lstatus": "committed", "lanalyst": analyst.username}
    html = officer_client.get(url, {**filters, "lpage": "2"}).content.decode()

    audit_next = parse_qs(urlsplit(_links(html, "audit")["next"]).query)
    assert audit_next == {**{k: [v] for k, v in filters.items()}, "lpage": ["2"], "apage": ["2"]}
    ledger_links = _links(html, "ledger")
    assert parse_qs(urlsplit(ledger_links["next"]).query) == {**{k: [v] for k, v in filters.items()},
                                                                "lpage": ["3"]}
    assert parse_qs(urlsplit(ledger_links["previous"]).query)["lpage"] == ["1"]

    # following the audit trail's next link: its page 2, still filtered, the ledger still on page 2
    page = officer_client.get(url + _links(html, "audit")["next"]).content.decode()
    audit_table = page.split('id="audit"')[1].split("</table>")[0]
    assert "<td>commit</td>" in audit_table and "<td>refuse</td>" not in audit_table
    assert "page 2 of" in page.split('id="audit"')[1] and "page 2 of" in page.split('id="ledger"')[1]
    ledger_table = page.split('id="ledger"')[1].split("</table>")[0]
    assert "<td>committed</td>" in ledger_table and "<td>released</td>" not in ledger_table

    # the filter forms keep the rest of the query too; a list filtered anew starts at its page 1
    ledger_form = page.split('id="ledger-filter"')[1].split("</form>")[0]
    assert 'type="hidden" name="apage" value="2"' in ledger_form and 'name="lpage"' not in ledger_form
    assert 'type="hidden" name="action" value="commit"' in ledger_form
    audit_form = page.split('id="audit-filter"')[1].split("</form>")[0]
    assert 'type="hidden" name="lpage" value="2"' in audit_form and 'name="apage"' not in audit_form
    assert 'type="hidden" name="lstatus" value="committed"' in audit_form


def test_the_pager_escapes_what_it_keeps(officer_client, survey, analyst):
    from governance.ledger import actions as ledger

    for _ in range(30):
        ledger.commit(ledger.admit(survey, analyst, {"kind": "laplace", "epsilon": 0.001}))
    url = f"/admin/governance/dataset/{survey.pk}/overview/"
    html = officer_client.get(url, {"lanalyst": '"><script>alert(1)</script>'}).content.decode()
    assert "<script>alert(1)" not in html
