"""The documentation site builds clean and says what the code does (issue 25).

``mkdocs build --strict`` (warnings are errors: a broken link or anchor, a page left out
of the nav, a snippet that is missing) into a temporary directory, with the MkDocs of this
virtualenv; the REST reference, rendered at build time from ``manage.py spectacular``
(docs/hooks/openapi.py), lists every path and operation of the schema the service serves;
every setting the settings module reads from the environment is documented on the
operations page; the README stays short and its links into docs/ resolve."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).parent / "mkdocs"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    assert MKDOCS.exists(), f"{MKDOCS} is missing: mkdocs is pinned in requirements.txt (scripts/bootstrap.sh)"
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "GOVERNANCE_VAR_DIR": str(tmp_path_factory.mktemp("var"))}
    start = time.monotonic()
    r = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "WARNING" not in r.stderr, r.stderr[-5000:]
    print(f"mkdocs build --strict: {time.monotonic() - start:.1f} s")
    return out


def openapi_schema() -> dict:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def test_the_site_builds_with_warnings_as_errors(site):
    for page in ("index", "getting-started/index", "concepts/index", "accounting/index", "engines/index",
                 "rest-api/index", "reference/rest/index", "client/index", "operations/index",
                 "benchmarks/index", "architecture/index", "privacy/index"):
        assert (site / f"{page}.html").exists(), page


def test_the_site_fetches_nothing_from_other_hosts(site):
    for page in site.rglob("*.html"):
        text = page.read_text()
        remote = re.findall(r"<(?:script|link|img)\b[^>]*(?:src|href)=\"(?:https?:)?//[^\"]+", text)
        assert not remote, (page, remote[:3])


def test_the_rest_reference_lists_every_path_and_operation_of_the_schema(site):
    page = html.unescape((site / "reference" / "rest" / "index.html").read_text())
    schema = openapi_schema()
    assert schema["paths"]
    for path, operations in schema["paths"].items():
        assert f"<code>{path}</code>" in page, path
        for method in operations:
            if method in ("get", "post", "put", "patch", "delete"):
                assert f"<code>{method.upper()} {path}</code>" in page, (method, path)
    for name in schema["components"]["schemas"]:
        assert f'id="schema-{name.lower()}"' in page, name


def test_every_setting_read_from_the_environment_is_documented():
    source = Path(importlib.util.find_spec(os.environ["DJANGO_SETTINGS_MODULE"]).origin).read_text()
    names = set(re.findall(r"env(?:str|secret|bool|int|list|float)?\(\s*\"([A-Z][A-Z0-9_]+)\"", source))
    names |= set(re.findall(r"os\.environ(?:\.get\(|\[)\s*\"([A-Z][A-Z0-9_]+)\"", source))
    assert len(names) > 20, names
    operations = (ROOT / "docs" / "operations.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in operations)
    assert not missing, f"settings not on docs/operations.md: {missing}"


def test_the_readme_is_short_and_its_links_into_docs_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    links = re.findall(r"\]\(((?:docs|bench)/[^)#\s]+)", readme)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert (ROOT / link).exists(), link


def test_bench_readme_keeps_one_command_per_capability():
    text = (ROOT / "bench" / "README.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(sections) >= 10
    for section in sections:
        title = section.splitlines()[0]
        if title.startswith("Not re-measured"):
            continue
        assert re.search(r"bench/[a-z_]+\.(py|sh)|tests/hostile", section), f"no command in {title!r}"
        assert re.search(r"20\d\d-\d\d-\d\d", section), f"no date in {title!r}"
