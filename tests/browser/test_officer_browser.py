"""The privacy officer's web UI in Chromium, end to end against the live server: log in,
register a dataset from a CSV upload, activate it, grant an analyst, watch the gauge move
after the analyst's request, estimate, export the PDF report, verify the audit chain.
Screenshots go to artifacts/browser/; any console or JavaScript error fails the test."""

from __future__ import annotations

import json
import random
import re
import urllib.error
import urllib.request

import pytest
from rest_framework.authtoken.models import Token

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
SCHEMA = {"age": {"lower": 18, "upper": 90}, "income": {"lower": 0, "upper": 200000}}
GAUGE_RE = re.compile(r"epsilon spent (\S+) / (\S+)$")


def write_csv(path, n=300, seed=7):
    rng = random.Random(seed)
    lines = ["age,income"] + [f"{rng.randint(18, 89)},{rng.uniform(10_000, 150_000):.2f}" for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def api(base_url, token, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base_url + path, data=data, method=method,
                                 headers={"Authorization": f"Token {token}", "Accept": "application/json",
                                          **({"Content-Type": "application/json"} if data else {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def rdp_spent(page) -> float:
    label = page.locator('#gauges svg.gauge[aria-label^="rdp epsilon spent"]').get_attribute("aria-label")
    m = GAUGE_RE.search(label)
    assert m, label
    return float(m.group(1))


def success_message(page, text):
    page.locator(".messagelist li.success", has_text=text).wait_for()


def login(page, base_url, username, password):
    page.goto(f"{base_url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login-form input[type=submit]")


def test_officer_registers_grants_watches_the_gauge_and_exports(
        browser_page, screenshot, live_server, django_user_model, tmp_path):
    page, base = browser_page, live_server.url
    django_user_model.objects.create_user("olivia", password=PASSWORD, is_staff=True)
    ann = django_user_model.objects.create_user("ann")
    token = Token.objects.create(user=ann).key

    # -- log in: the dashboard is the admin index
    login(page, base, "olivia", PASSWORD)
    page.wait_for_url(f"{base}/admin/")
    assert page.title().startswith("Budget dashboard")
    assert "No datasets yet" in page.locator("table#datasets").inner_text()
    screenshot("01-dashboard-empty.png")

    # -- register a dataset from an uploaded CSV: it lands on its change page, as a draft
    page.goto(f"{base}/admin/governance/dataset/register/")
    page.fill("#id_name", "clinic")
    page.fill("#id_title", "Clinic visits (browser test)")
    page.set_input_files("#id_upload", str(write_csv(tmp_path / "clinic.csv")))
    page.fill("#id_budget_epsilon", "1.0")
    page.fill("#id_budget_delta", "auto")
    page.select_option("#id_policy", "rdp")
    page.fill("#id_schema", json.dumps(SCHEMA))
    screenshot("02-register-form.png")
    page.click("input[type=submit][value=Register]")
    page.wait_for_url(re.compile(r"/admin/governance/dataset/\d+/change/$"))
    success_message(page, "Registered clinic as a draft")
    pk = int(re.search(r"/dataset/(\d+)/change/", page.url).group(1))
    screenshot("03-dataset-draft.png")

    # -- activate it with the change list's admin action
    page.goto(f"{base}/admin/governance/dataset/")
    page.check(f"input[name=_selected_action][value='{pk}']")
    page.select_option("select[name=action]", "activate")
    page.click("button[name=index]")
    success_message(page, "Activated 1 dataset(s)")
    assert "active" in page.locator("#result_list tbody tr").first.inner_text()
    screenshot("04-dataset-activated.png")

    # -- dashboard -> dataset page -> "Grant an analyst"
    page.goto(f"{base}/admin/")
    page.click("table#datasets a.ds-link:text-is('clinic')")
    page.wait_for_url(f"{base}/admin/governance/dataset/{pk}/overview/")
    page.click("#add-grant")
    page.wait_for_url(re.compile(r"/admin/governance/grant/add/"))
    assert page.locator("#id_dataset").input_value() == str(pk)
    page.select_option("#id_analyst", label="ann")
    screenshot("05-grant-form.png")
    page.click("input[name=_save]")
    success_message(page, "was added successfully")
    screenshot("06-grant-added.png")

    # -- the dataset page before any request
    page.goto(f"{base}/admin/governance/dataset/{pk}/overview/")
    before = rdp_spent(page)
    assert before == 0
    assert "ann" in page.locator("table#grants").inner_text()
    screenshot("07-overview-before.png")

    # -- the analyst asks for a count through the REST API (Celery is eager in tests)
    status, body = api(base, token, "POST", "/api/requests/",
                       {"dataset": "clinic", "engine": "aggregates", "kind": "count", "params": {"epsilon": 0.3}})
    assert status == 202, body
    status, body = api(base, token, "GET", f"/api/requests/{body['id']}/")
    assert status == 200 and body["status"] == "succeeded", body

    # -- the gauge moved, and the audit trail shows ann's commit
    page.reload()
    after = rdp_spent(page)
    assert before < after <= 0.3 + 1e-9, (before, after)
    assert after == pytest.approx(0.3, abs=0.05)
    commits = page.locator("table#audit tr", has=page.locator("td:text-is('commit')"))
    assert commits.count() == 1 and "ann" in commits.first.inner_text()
    assert "succeeded" in page.locator("table#requests").inner_text()
    screenshot("08-overview-after.png")

    # -- the dashboard's gauge for the dataset moved too
    page.goto(f"{base}/admin/")
    label = page.locator('table#datasets svg.gauge[aria-label^="clinic epsilon spent"]').get_attribute("aria-label")
    assert float(GAUGE_RE.search(label).group(1)) == pytest.approx(after, abs=1e-3)
    screenshot("09-dashboard-after.png")
    page.goto(f"{base}/admin/governance/dataset/{pk}/overview/")

    # -- the estimate tool
    page.fill("form#estimate textarea[name=event]", json.dumps({"kind": "laplace", "epsilon": 0.1}))
    page.click("form#estimate input[type=submit]")
    page.locator("#estimate-result").wait_for()
    assert "Would be admitted now" in page.content()
    screenshot("10-estimate.png")

    # -- the PDF report downloads
    with page.expect_download() as info:
        page.click("#export-pdf")
    pdf = tmp_path / "report.pdf"
    info.value.save_as(pdf)
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF") and len(data) > 5_000, (data[:20], len(data))
    assert info.value.suggested_filename == "audit-clinic.pdf"

    # -- "Verify chain" comes back to the dataset page with the verdict
    page.click("#exports a:text-is('Verify chain')")
    success_message(page, "Audit chain verified")
    assert page.url.split("?")[0] == f"{base}/admin/governance/dataset/{pk}/overview/"
    screenshot("11-chain-verified.png")

    # -- a federated dataset's page lists its sites (issue 27; its rows stay at them)
    from governance.datasets import registry

    fed = registry.register(name="wards", created_by=django_user_model.objects.get(username="olivia"),
                            schema=[{"name": "x", "type": "numeric", "lower": 0, "upper": 1}], budget_epsilon=1.0,
                            execution="federated", sites=[{"site": "h1", "n_rows": 120}, {"site": "h2", "n_rows": 80}])
    page.goto(f"{base}/admin/governance/dataset/{fed.pk}/overview/")
    sites = page.locator("table#sites").inner_text()
    assert "h1" in sites and "120" in sites and "h2" in sites and "never" in sites
    screenshot("11b-federated-sites.png")


def test_analyst_cannot_log_into_the_officer_ui(browser_page, screenshot, live_server, django_user_model):
    page, base = browser_page, live_server.url
    django_user_model.objects.create_user("ann", password=PASSWORD)
    login(page, base, "ann", PASSWORD)
    page.locator(".errornote").wait_for()
    assert page.url.startswith(f"{base}/admin/login/")
    screenshot("12-login-refused.png")
