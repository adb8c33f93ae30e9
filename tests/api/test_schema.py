"""The OpenAPI document and its UI: /api/schema/, /api/docs/, ``manage.py spectacular``."""

import os
import re
import subprocess
import sys

import pytest
from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db


def api_paths() -> set[str]:
    """Every path the URLconf routes under /api/, in OpenAPI form (``{name}``)."""
    out = set()

    def walk(patterns, prefix):
        for p in patterns:
            regex = p.pattern.regex.pattern if hasattr(p.pattern, "regex") else str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + regex)
            elif isinstance(p, URLPattern):
                full = (prefix + regex).replace("^", "").replace("$", "").replace("\\Z", "")
                if "format" in full or full == "api/" or not full.startswith("api/"):
                    continue  # format suffixes, the router's browsable root, admin
                full = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", full)
                full = full.replace("{pk}", "{id}")  # drf-spectacular's SCHEMA_COERCE_PATH_PK
                out.add("/" + full)

    walk(get_resolver().url_patterns, "")
    return out - {"/api/schema/", "/api/docs/"}


def test_it_serves_an_openapi_document_listing_every_endpoint(api, officer):
    r = api(officer).get("/api/schema/", {"format": "json"})
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    assert doc["info"]["title"] == settings.SPECTACULAR_SETTINGS["TITLE"]
    expected = api_paths()
    assert len(expected) >= 16
    assert set(doc["paths"]) == expected
    for path in ("/api/datasets/{name}/estimate/", "/api/datasets/{name}/charges/", "/api/compose/",
                 "/api/grants/{id}/", "/api/analysts/{id}/token/", "/api/me/"):
        assert path in doc["paths"]
    assert doc["components"]["securitySchemes"]["tokenAuth"]["type"] == "apiKey"


def test_it_documents_the_request_bodies(api, officer):
    doc = api(officer).get("/api/schema/", {"format": "json"}).json()
    create = doc["paths"]["/api/datasets/"]["post"]["requestBody"]["content"]
    assert "multipart/form-data" in create and "application/json" in create
    schemas = doc["components"]["schemas"]
    assert {"name", "budget_epsilon"} <= set(schemas["DatasetCreateRequest"]["required"])
    assert schemas["DatasetStatusEnum"]["enum"] == ["pending", "failed", "draft", "active"]
    assert schemas["LedgerStatusEnum"]["enum"] == ["reserved", "committed", "released"]
    assert schemas["RequestStatusEnum"]["enum"] == ["queued", "running", "succeeded", "failed", "cancelled"]
    assert "/api/requests/" in doc["paths"] and "/api/engines/" in doc["paths"]


def test_it_documents_what_the_endpoints_really_answer(api, officer, analyst, make_dataset, grant):
    """A probe compared real answers with the schema: no operation listed an error answer,
    the officer's dataset fields, a recommendation's and a verification's fields were
    missing, files were all octet-stream, budget_delta a string, and a token's POST and
    DELETE each claimed 200 and 204."""
    doc = api(officer).get("/api/schema/", {"format": "json"}).json()
    paths, schemas = doc["paths"], doc["components"]["schemas"]
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    assert {"code", "detail"} <= set(schemas["Error"]["required"])
    submit = paths["/api/requests/"]["post"]["responses"]
    assert {"400", "401", "403", "409", "413", "415", "422", "429", "503"} <= set(submit)
    assert all(submit[c]["content"] == error for c in ("400", "409", "429"))
    for path, operations in paths.items():
        for method, op in operations.items():
            assert {"401", "503"} <= set(op["responses"]), (method, path)
            assert "{" not in path or "404" in op["responses"], (method, path)
    assert set(paths["/api/analysts/{id}/token/"]["post"]["responses"]) & {"200", "204"} == {"200"}
    assert set(paths["/api/analysts/{id}/token/"]["delete"]["responses"]) & {"200", "204"} == {"204"}
    files = paths["/api/requests/{id}/files/{name}/"]["get"]["responses"]["200"]["content"]
    assert {"text/csv", "application/json", "application/vnd.apache.parquet"} <= set(files)
    delta = schemas["DatasetCreateRequest"]["properties"]["budget_delta"]["oneOf"]
    assert [d["type"] for d in delta] == ["number", "string"] and delta[0]["minimum"] == 0
    assert "404" in paths["/api/requests/"]["get"]["responses"]  # ?page=0: "Invalid page."
    assert "400" in paths["/api/datasets/{name}/preview/"]["get"]["responses"]  # ?rows=0
    # every field a real answer holds is in the schema it names
    ds = make_dataset("clinic", epsilon=1.0)
    grant(analyst, ds)
    officer_view = api(officer).get("/api/datasets/clinic/").json()
    analyst_view = api(analyst).get("/api/datasets/clinic/").json()
    assert set(officer_view) <= set(schemas["OfficerDataset"]["properties"])
    assert set(analyst_view) <= set(schemas["Dataset"]["properties"])
    either = paths["/api/datasets/{name}/"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert {r["$ref"].rsplit("/", 1)[1] for r in either["anyOf"]} == {"OfficerDataset", "Dataset"}
    advice = api(analyst).get("/api/datasets/clinic/recommendation/").json()
    assert set(advice) == set(schemas["Recommendation"]["properties"])
    verified = api(officer).get("/api/audit/verify/").json()
    assert set(verified) == set(schemas["AuditVerification"]["properties"])


def test_it_serves_the_schema_to_anonymous_users(api):
    # drf-spectacular's default SERVE_PERMISSIONS: the document describes, it reveals no data
    r = api().get("/api/schema/", {"format": "json"})
    assert r.status_code == 200
    assert "/api/datasets/" in r.json()["paths"]


def test_it_renders_the_docs(api, officer):
    for client in (api(officer), api()):
        r = client.get("/api/docs/")
        assert r.status_code == 200
        assert b"swagger" in r.content.lower()
        script = client.get("/api/docs/", {"script": ""})  # the initializer, a script of its own
        assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")
        assert b"/api/schema/" in script.content


@pytest.mark.parametrize("method", ["OPTIONS", "POST", "PUT", "PATCH", "DELETE", "TRACE"])
def test_other_methods_on_the_docs_and_the_schema_are_a_405_not_a_500(api, officer, method):
    """OPTIONS /api/docs/ was a 500 for anyone (DRF's metadata rendered by the page's
    template renderer, which has no template for it)."""
    for client in (api(officer), api()):
        client.raise_request_exception = False
        for url in ("/api/docs/", "/api/docs/?script=", "/api/schema/"):
            r = client.generic(method, url)
            assert r.status_code < 500, (method, url, r.status_code)
            assert r.status_code == 405 or (method == "OPTIONS" and url == "/api/schema/"), (method, url)


def test_the_docs_load_nothing_from_another_host_and_keep_the_csp(client):
    """Issue 22: /api/docs/ loaded Swagger UI from a CDN and was exempt from the CSP (offline:
    a blank page). Every asset is now one of our static files, every script a file (no
    inline script: the CSP's script-src 'self' allows no other), and the page has the CSP."""
    from django.contrib.staticfiles import finders

    from governance.core.security import CSP

    r = client.get("/api/docs/")
    assert r.status_code == 200
    assert r["Content-Security-Policy"] == CSP and "script-src 'self'" in CSP
    html = r.content.decode()
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and not re.search(r"https?://|//[a-z]", html, re.I), refs
    assert all(ref.startswith("/") and not ref.startswith("//") for ref in refs), refs
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "an inline <script> the CSP would refuse"
    static = [ref for ref in refs if ref.startswith(settings.STATIC_URL if settings.STATIC_URL.startswith("/")
                                                    else "/" + settings.STATIC_URL)]
    assert len(static) >= 4  # css, favicon, bundle, preset
    for ref in static:
        assert finders.find(ref.split("/", 2)[2]), f"{ref} is not a static file of ours"
    script = client.get("/api/docs/", {"script": ""}).content.decode()
    assert "SwaggerUIBundle(" in script and not re.search(r"https?://", script)


def test_it_generates_a_valid_schema_without_warnings(tmp_path):
    out = tmp_path / "schema.yml"
    proc = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn", "--file", str(out)],
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
        env={**os.environ, "GOVERNANCE_VAR_DIR": str(tmp_path / "var")})
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr
    assert "/api/datasets/{name}/estimate/" in out.read_text()


@pytest.mark.django_db
def test_it_answers_unknown_api_urls_with_json(api, officer, settings):
    settings.DEBUG = False
    r = api(officer).get("/api/no-such-thing/")
    assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_a_dataset_s_ledger_documents_only_the_parameters_it_reads(api, officer):
    """It listed the dataset list's filters (policy, ordering), which it never read: a
    client that filtered by them got every entry back."""
    doc = api(officer).get("/api/schema/", {"format": "json"}).json()
    params = {p["name"] for p in doc["paths"]["/api/datasets/{name}/ledger/"]["get"]["parameters"] if p["in"] == "query"}
    assert "status" in params and not params & {"policy", "ordering", "search"}, params


def test_manage_py_generateschema_writes_the_services_schema(tmp_path):
    """DRF's own ``generateschema`` ended in a TypeError on the service's views: it is
    drf-spectacular's schema, as ``manage.py spectacular`` writes it."""
    import json

    from django.core.management import call_command

    out = tmp_path / "schema.json"
    call_command("generateschema", "--format", "openapi-json", "--file", str(out))
    schema = json.loads(out.read_text())
    assert schema["openapi"].startswith("3.") and "/api/requests/" in schema["paths"]
