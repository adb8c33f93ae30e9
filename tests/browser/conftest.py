"""Browser tests: Playwright's sync API driving Debian's Chromium (/usr/bin/chromium,
installed by ``scripts/services.sh chromium-install``, which ``scripts/test.sh`` runs).

``browser_page`` is a fresh headless page; every console error and uncaught page error
is collected and the test fails at teardown if there was any. ``screenshot(name)``
saves the page to ``artifacts/browser/<name>`` (git-ignored) for a human to look at.

Without /usr/bin/chromium the tests are skipped, except under CI (CI=true) where that
is a failure. Tests need ``live_server``, hence ``django_db(transaction=True)``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "browser"
VIEWPORT = {"width": 1400, "height": 900}
TIMEOUT_MS = 15_000


def _require_chromium():
    if CHROMIUM.exists():
        return
    message = f"{CHROMIUM} not found: run `scripts/services.sh chromium-install` (as root) for the browser tests"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " -- CI requires it", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def _chromium(monkeypatch):
    """One Playwright + Chromium per test: Playwright's sync API keeps an asyncio loop
    running on this thread while it lives, so nothing of it may outlive the test (other
    tests' ORM calls would be refused)."""
    _require_chromium()
    # With that loop running Django refuses ORM calls from the test body
    # (SynchronousOnlyOperation). The test code is synchronous and the live server runs
    # in its own thread, so the check is switched off for this test only.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from django.db import connections
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()
            # While the loop runs, Django keeps this thread's connections apart from the
            # ones it sees afterwards (asgiref's Local switches to context storage), so
            # pytest-django would never close a connection the test body opened: it would
            # linger and keep PostgreSQL from dropping the test database. Close it here.
            connections.close_all()


@pytest.fixture
def console_errors():
    """Console messages of type "error" and uncaught page errors, as strings."""
    return []


@pytest.fixture
def browser_page(_chromium, console_errors):
    context = _chromium.new_context(viewport=VIEWPORT, accept_downloads=True)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    favicon_missing = []

    def on_console(msg):
        if msg.type != "error":
            return
        url = msg.location.get("url", "") or "?"
        if urlsplit(url).path == "/favicon.ico":
            # Chromium's own request for a tab icon, not something a page asked for: the
            # site serves none (see the warning below), which is not a page error.
            favicon_missing.append(url)
            return
        console_errors.append(f"console.error at {url}: {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: console_errors.append(f"page error: {exc}"))
    try:
        yield page
    finally:
        context.close()
    if favicon_missing:
        warnings.warn(f"the site has no favicon: {favicon_missing[0]} answered 404", stacklevel=1)
    assert console_errors == [], "console or JavaScript errors in the browser:\n" + "\n".join(console_errors)


@pytest.fixture
def screenshot(browser_page):
    """``screenshot("01-dashboard.png")``: a full-page PNG under artifacts/browser/."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def shot(name: str) -> Path:
        path = ARTIFACTS / name
        browser_page.screenshot(path=str(path), full_page=True)
        return path
    return shot
