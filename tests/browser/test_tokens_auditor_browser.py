"""The auditor's pages and the token pages in Chromium (issue 26): an auditor signs in with
their token, walks from every chain to one dataset's trail, filters it, pages it with the
filter kept, verifies the chain and downloads the PDF report; an analyst issues themselves
a new token; an officer issues one for an analyst and uses the estimate tool with SQL."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Group
from rest_framework.authtoken.models import Token

from governance.core import roles
from governance.ledger import actions as ledger
from governance.models import Dataset
from tests.browser.test_officer_browser import PASSWORD, login

pytestmark = pytest.mark.django_db(transaction=True)


def token_login(page, base, key):
    page.goto(f"{base}/analyst/login/")
    page.fill("input[name=token]", key)
    page.click("input[type=submit]")


def test_an_auditor_walks_the_chains(browser_page, live_server, django_user_model, analyst, make_dataset, grant,
                                     screenshot):
    page, base = browser_page, live_server.url
    auditor = django_user_model.objects.create_user("audrey")
    auditor.groups.add(Group.objects.get_or_create(name=roles.AUDITORS_GROUP)[0])
    ds = make_dataset("clinic", epsilon=100.0)
    grant(analyst, ds)
    for i in range(60):
        entry = ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.001})
        ledger.release(entry) if i % 10 == 9 else ledger.commit(entry)

    token_login(page, base, Token.objects.create(user=auditor).key)
    page.wait_for_url(f"{base}/auditor/")
    assert "clinic" in page.locator("#chains").inner_text()
    page.click("#chains a:has-text('clinic')")
    page.wait_for_url(f"{base}/auditor/datasets/clinic/")
    page.select_option("#filters select[name=action]", "commit")
    page.click("#filters input[type=submit]")
    page.wait_for_url("**action=commit**")
    page.click("#older")
    page.wait_for_url("**page=2**")
    assert parse_qs(urlsplit(page.url).query) == {"action": ["commit"], "page": ["2"]}
    assert set(page.locator("#records td:nth-child(3)").all_inner_texts()) == {"commit"}
    screenshot("auditor-trail.png")
    page.click("#verify")
    page.wait_for_url("**/auditor/verify/**")
    assert page.locator("#verdict").inner_text().startswith("OK")
    page.go_back()
    with page.expect_download() as download:
        page.click("#export-pdf")
    assert download.value.suggested_filename.endswith(".pdf")


def test_tokens_from_the_web(browser_page, live_server, officer, analyst, make_dataset, screenshot):
    page, base = browser_page, live_server.url
    make_dataset("clinic", epsilon=5.0)
    old = Token.objects.create(user=analyst).key
    token_login(page, base, old)
    page.wait_for_url(f"{base}/analyst/")
    page.click("#new-token")
    new = page.locator("#token-value").inner_text().strip()
    assert new == Token.objects.get(user=analyst).key != old
    page.goto(f"{base}/analyst/")  # still signed in
    assert "My datasets" in page.content()

    officer.set_password(PASSWORD)
    officer.save()
    officer_page = page.context.browser.new_context().new_page()
    login(officer_page, base, "olivia", PASSWORD)
    officer_page.wait_for_url(f"{base}/admin/")
    officer_page.click("#api-tokens")
    officer_page.click("#issue-ann")
    issued = officer_page.locator("#token-value").inner_text().strip()
    assert issued == Token.objects.get(user=analyst).key != new
    officer_page.goto(f"{base}/admin/governance/dataset/{Dataset.objects.get(name='clinic').pk}/overview/")
    officer_page.check("#estimate input[value=sql]")
    officer_page.fill("#estimate textarea", 'SELECT COUNT(*), AVG(income) FROM "clinic"')
    officer_page.click("#estimate input[type=submit]")
    officer_page.wait_for_selector("#estimate-result")
    assert "aggregates / query" in officer_page.locator("#estimate-request").inner_text()
    officer_page.context.close()
