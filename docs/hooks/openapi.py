"""MkDocs hook: the REST reference (docs/reference/rest.md) rendered from the OpenAPI schema.

At every build it runs ``manage.py spectacular --format openapi-json`` (the schema the
service serves at /api/schema/) with the Python that runs MkDocs, and adds one generated
page to the site: every path and method with its parameters, request body, responses and
the schemas they refer to. Nothing is fetched from the network; the page is never written
into docs/ (it exists only in the built site), so it cannot drift from the code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

PAGE = "reference/rest.md"
ROOT = Path(__file__).resolve().parents[2]
METHODS = ("get", "post", "put", "patch", "delete")


def load_schema() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "schema.json"
        env = {**os.environ, "GOVERNANCE_VAR_DIR": os.environ.get("GOVERNANCE_VAR_DIR", str(Path(tmp) / "var"))}
        r = subprocess.run(
            [sys.executable, "manage.py", "spectacular", "--format", "openapi-json", "--file", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not out.exists():
            raise PluginError(f"manage.py spectacular failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        return json.loads(out.read_text())


def cell(text) -> str:
    """One table cell: no newlines, no bare pipes."""
    return " ".join(str(text or "").split()).replace("|", "\\|")


def para(text) -> str:
    """A description as a paragraph (reST double backticks as Markdown code)."""
    return str(text or "").replace("``", "`").strip()


def anchor(name: str) -> str:
    return "schema-" + name.lower()


def type_of(schema: dict) -> str:
    if not schema:
        return "any"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{anchor(name)})"
    for key in ("allOf", "oneOf", "anyOf"):
        if key in schema:
            joiner = " and " if key == "allOf" else " or "
            return joiner.join(type_of(s) for s in schema[key])
    t = schema.get("type", "object" if "properties" in schema else "any")
    if t == "array":
        return f"array of {type_of(schema.get('items', {}))}"
    if "enum" in schema:
        values = ", ".join(f"`{v}`" for v in schema["enum"] if v not in (None, ""))
        return f"{t}: {values}" if values else t
    fmt = schema.get("format")
    out = f"{t} ({fmt})" if fmt else t
    if schema.get("nullable"):
        out += ", nullable"
    return out


def op_id(method: str, path: str, op: dict) -> str:
    """The operation's anchor: its operationId, as the heading's id."""
    raw = op.get("operationId") or (method + path)
    return "".join(c if c.isalnum() else "-" for c in raw.lower()).strip("-")


def operation(path: str, method: str, op: dict) -> list[str]:
    lines = [f"### `{method.upper()} {path}` {{#{op_id(method, path, op)}}}", ""]
    if op.get("description"):
        lines += [para(op["description"]), ""]
    auth = [next(iter(s), None) for s in op.get("security", [])]
    if not op.get("security") or {} in op.get("security", []):
        lines += ["Authentication: none required.", ""]
    elif auth:
        lines += ["Authentication: " + ", ".join(f"`{a}`" for a in auth if a) + ".", ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            lines.append(f"| `{p['name']}` | {p['in']} | {cell(type_of(p.get('schema', {})))} | "
                         f"{'yes' if p.get('required') else 'no'} | {cell(p.get('description'))} |")
        lines.append("")
    body = op.get("requestBody")
    if body:
        content = body.get("content", {})
        kinds = ", ".join(f"`{k}`" for k in content)
        first = next(iter(content.values()), {}).get("schema", {})
        lines += [f"Request body ({kinds}): {type_of(first)}" + (" (required)" if body.get("required") else ""), ""]
    responses = op.get("responses", {})
    if responses:
        lines += ["| status | body | description |", "|---|---|---|"]
        for status, resp in responses.items():
            content = resp.get("content", {})
            body_type = ", ".join(f"{type_of(c.get('schema', {}))} (`{k}`)" for k, c in content.items()) or "-"
            lines.append(f"| {status} | {cell(body_type)} | {cell(resp.get('description'))} |")
        lines.append("")
    return lines


def render(schema: dict) -> str:
    info = schema.get("info", {})
    paths = schema.get("paths", {})
    lines = [
        "# REST reference",
        "",
        f"Generated at build time from the service's OpenAPI schema ({info.get('title', '')}, "
        f"version {info.get('version', '')}; OpenAPI {schema.get('openapi', '')}), the schema a "
        "running service serves at `/api/schema/` (and as Swagger UI at `/api/docs/`). "
        "Who may call what, the error codes and the limits are in the "
        "[REST API overview](../rest-api.md).",
        "",
        f"{len(paths)} paths:",
        "",
    ]
    for path, ops in paths.items():
        methods = ", ".join(f"[{m.upper()}](#{op_id(m, path, ops[m])})" for m in METHODS if m in ops)
        lines.append(f"- `{path}` ({methods})")
    lines.append("")
    by_tag: dict[str, list[tuple[str, str, dict]]] = {}
    for path, ops in paths.items():
        for method in METHODS:
            if method in ops:
                tag = (ops[method].get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((path, method, ops[method]))
    for tag in sorted(by_tag):
        lines += [f"## {tag}", ""]
        for path, method, op in by_tag[tag]:
            lines += operation(path, method, op)
    schemes = schema.get("components", {}).get("securitySchemes", {})
    if schemes:
        lines += ["## Authentication schemes", "", "| name | type | where | description |", "|---|---|---|---|"]
        for name, s in schemes.items():
            lines.append(f"| `{name}` | {s.get('type')} | {s.get('in', '')} `{s.get('name', '')}` | "
                         f"{cell(s.get('description'))} |")
        lines.append("")
    lines += ["## Schemas", ""]
    for name, s in sorted(schema.get("components", {}).get("schemas", {}).items()):
        lines += [f"### {name} {{#{anchor(name)}}}", ""]
        if s.get("description"):
            lines += [para(s["description"]), ""]
        props = s.get("properties")
        required = set(s.get("required", []))
        if props:
            lines += ["| field | type | required | description |", "|---|---|---|---|"]
            for field, fs in props.items():
                flags = []
                if fs.get("readOnly"):
                    flags.append("read-only")
                if fs.get("writeOnly"):
                    flags.append("write-only")
                desc = cell(fs.get("description"))
                if flags:
                    desc = f"({', '.join(flags)}) {desc}".strip()
                lines.append(f"| `{field}` | {cell(type_of(fs))} | {'yes' if field in required else 'no'} | {desc} |")
            lines.append("")
        else:
            lines += [f"Type: {type_of(s)}", ""]
    return "\n".join(lines) + "\n"


def on_files(files, config):
    content = render(load_schema())
    existing = files.get_file_from_path(PAGE)
    if existing is not None:
        files.remove(existing)
    files.append(File.generated(config, PAGE, content=content))
    return files
