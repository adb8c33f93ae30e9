"""/api/docs/ in Chromium with every request to another host refused (issue 22): Swagger
UI came from a CDN and the page was exempt from the CSP, so offline it was blank with
console errors. Now it must render the API's operations from our own static files, under
the CSP, without a console error (the ``browser_page`` fixture fails the test on any)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.django_db(transaction=True)

LOCAL = {"localhost", "127.0.0.1", "[::1]", "::1"}


def test_the_api_docs_render_offline_under_the_csp(browser_page, screenshot, live_server, console_errors):
    page, base = browser_page, live_server.url
    blocked, csp_reports = [], []

    def only_local(route):
        host = urlsplit(route.request.url).hostname or ""
        if route.request.url.startswith(("data:", "blob:")) or host in LOCAL:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.on("console", lambda msg: "Content Security Policy" in msg.text and csp_reports.append(msg.text))

    r = page.goto(f"{base}/api/docs/")
    assert r.status == 200
    assert "script-src 'self'" in r.headers["content-security-policy"]
    page.locator(".opblock").first.wait_for()
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert any(p.strip().startswith("/api/datasets/") for p in paths), paths[:10]
    assert any(p.strip().startswith("/api/requests/") for p in paths), paths[:10]
    assert len(paths) >= 20, len(paths)
    assert page.locator(".info .title").inner_text().startswith("Privacy-budget governance API")

    # expand one operation: its parameters and responses render too
    page.locator(".opblock-summary", has_text="/api/datasets/").first.click()
    page.locator(".opblock-body .responses-wrapper").first.wait_for()
    screenshot("api-docs-offline.png")

    assert blocked == [], f"the page asked for another host: {blocked}"
    assert csp_reports == [], csp_reports
    assert console_errors == [], console_errors
