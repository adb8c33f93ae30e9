"""The officer's dataset page in Chromium (issue 22): paging the filtered audit trail
kept neither its filters nor the ledger's (the link was ``?apage=2``). Clicking "next"
and then filtering the ledger must keep everything else in the address."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from governance.ledger import actions as ledger
from tests.browser.test_officer_browser import PASSWORD, login

pytestmark = pytest.mark.django_db(transaction=True)


def test_paging_and_filtering_keep_the_rest_of_the_address(browser_page, live_server, officer, analyst,
                                                           make_dataset, grant):
    page, base = browser_page, live_server.url
    officer.set_password(PASSWORD)
    officer.save()
    ann = analyst
    ds = make_dataset("clinic", epsilon=100.0)
    grant(ann, ds)
    for _ in range(60):
        ledger.commit(ledger.admit(ds, ann, {"kind": "laplace", "epsilon": 0.001}))

    login(page, base, "olivia", PASSWORD)
    page.wait_for_url(f"{base}/admin/")
    page.goto(f"{base}/admin/governance/dataset/{ds.pk}/overview/?action=commit&actor=ann&lstatus=committed&lpage=2")

    page.locator("#audit ~ p.paginator a", has_text="next").first.click()
    page.wait_for_url("**apage=2**")
    query = parse_qs(urlsplit(page.url).query)
    assert query == {"action": ["commit"], "actor": ["ann"], "lstatus": ["committed"], "lpage": ["2"],
                     "apage": ["2"]}
    assert "page 2 of" in page.locator("#audit ~ p.paginator").first.inner_text()

    # filtering the ledger anew: its page starts again, the audit trail's filters and page stay
    page.fill("#ledger-filter input[name=lanalyst]", "ann")
    page.click("#ledger-filter input[type=submit]")
    page.wait_for_url("**lanalyst=ann**")
    query = parse_qs(urlsplit(page.url).query)
    assert query == {"action": ["commit"], "actor": ["ann"], "lstatus": ["committed"], "lanalyst": ["ann"],
                     "apage": ["2"]}
