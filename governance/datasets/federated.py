"""Federated datasets: the rows stay at their sites (issue 27, engines/federated).

A dataset whose ``execution`` is ``federated`` has no file: the service holds its declared
schema, its sites (``FederatedSite``: id and public row count; ``n_rows``/``n_units`` are
their sums) and its budget. Each site runs a site agent (``python -m engines.federated.site``)
that connects to the Flower SuperLink at ``FEDERATED_SUPERLINK``; a run of the
``federated`` engine gets an ``engines.federated.Federation`` in place of a table
(``federation``, called by ``governance.datasets.data.load_columns``).

Site secrets are never stored: ``site_secret`` derives each one as
``HMAC-SHA256(SECRET_KEY, "federated-site|" + dataset + "|" + site)``, so the worker can check
every reply's MAC and an officer can hand a site its secret (``manage.py federated secret``,
``POST /api/datasets/{name}/sites/{site}/secret/``, officers only). Rotating SECRET_KEY
changes every site's secret: hand them out again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re

import pyarrow as pa
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..core.errors import InvalidDataset
from ..ledger import trail
from ..models import Budget, Dataset, FederatedSite
from .budget import parse_budget
from .schema import validate_schema

SITE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # fullmatch: "$" also matches before a final newline
MAX_SITES = 10_000
MAX_SITE_ROWS = 10**12


class SitesUnavailable(InvalidDataset):
    """A federated run cannot start: no SuperLink is configured (the run is refunded)."""

    code = "federated.unavailable"


def site_secret(dataset_name: str, site: str) -> str:
    """The site's shared secret, derived (never stored): what its agent's ``--key`` takes."""
    msg = f"federated-site|{dataset_name}|{site}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), msg, hashlib.sha256).hexdigest()


def issue_secret(ds: Dataset, site: str, actor: str) -> str:
    """Hand out a site's secret to ``actor`` (an officer's user name, or ``manage.py``):
    noted on the site (``secret_issued_at``) and as a ``site_key`` record in the dataset's
    audit chain, in one transaction; unknown sites refused."""
    if ds.execution != Dataset.Execution.FEDERATED:
        raise InvalidDataset(f"dataset {ds.name!r} is not federated: it has no sites", field="site")
    with transaction.atomic():
        if not FederatedSite.objects.filter(dataset=ds, site=site).update(secret_issued_at=timezone.now()):
            raise InvalidDataset(f"{site!r} is not a site of {ds.name!r}; its sites: "
                                 + ", ".join(sites_of(ds)[:20]), field="site")
        trail.record_site_key(ds, actor, site)
    return site_secret(ds.name, site)


def sites_of(ds: Dataset) -> list[str]:
    return list(FederatedSite.objects.filter(dataset=ds).order_by("id").values_list("site", flat=True))


def site_rows(ds: Dataset) -> tuple[dict, ...]:
    """The registered sites as the engine's ``FederatedDatasetMeta.sites``, in registration order."""
    return tuple({"site": s, "n_rows": n} for s, n in
                 FederatedSite.objects.filter(dataset=ds).order_by("id").values_list("site", "n_rows"))


def federation(ds: Dataset):
    """How a run reaches the dataset's sites (in place of a table): the SuperLink and each
    registered site's secret. Raises ``SitesUnavailable`` when no SuperLink is configured."""
    from engines.federated.types import Federation

    if not settings.FEDERATED_SUPERLINK:
        raise SitesUnavailable("FEDERATED_SUPERLINK is not set: this service runs no federated training")
    ca = settings.FEDERATED_ROOT_CERTIFICATES
    return Federation(superlink=settings.FEDERATED_SUPERLINK,
                      site_keys={s: site_secret(ds.name, s) for s in sites_of(ds)},
                      insecure=not ca, root_certificates=ca or None,
                      wait_sites_seconds=float(settings.FEDERATED_WAIT_SITES_SECONDS),
                      round_timeout=float(settings.FEDERATED_ROUND_TIMEOUT_SECONDS))


# --------------------------------------------------------------------------- schema


def _declared_type(spec: dict) -> pa.DataType:
    typ = spec.get("type")
    if typ == "numeric":
        return pa.int64() if spec.get("integer") else pa.float64()
    if typ == "categorical":
        dom = spec.get("domain") if isinstance(spec.get("domain"), list) else []
        if dom and all(isinstance(v, bool) for v in dom):
            return pa.bool_()
        if dom and all(isinstance(v, int) and not isinstance(v, bool) for v in dom):
            return pa.int64()
        if dom and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in dom):
            return pa.float64()
    return pa.string()


def arrow_schema(columns: list[dict]) -> pa.Schema:
    """The Arrow schema a declared schema stands for (the sites' tables are never seen)."""
    return pa.schema([(c["name"], _declared_type(c)) for c in columns])


def declared_schema(schema) -> dict:
    """The officer's declared schema, checked as any dataset's (``validate_schema``) against
    the table it describes. Every column needs its ``type``: nothing is inferred."""
    if isinstance(schema, dict) and "columns" in schema:
        schema = schema["columns"]
    if isinstance(schema, dict):
        schema = [{"name": k, **(v if isinstance(v, dict) else {})} for k, v in schema.items()]
    if not isinstance(schema, list) or not schema:
        raise InvalidDataset("a federated dataset needs its declared schema: a non-empty list of column specs "
                             "(each with name and type) or {\"columns\": [...]}", field="schema")
    errors, names = {}, set()
    for spec in schema:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise InvalidDataset("each column spec must be an object with a 'name'", field="schema")
        if spec["name"] in names:
            errors[spec["name"]] = "declared twice"
        names.add(spec["name"])
        if spec.get("type") == "unit":
            errors[spec["name"]] = "a federated dataset has no privacy-unit column (one row is one unit)"
        elif "type" not in spec:
            errors[spec["name"]] = "declare its type (numeric, categorical or text): nothing is read from the rows"
    if errors:
        raise InvalidDataset("The schema has problems.", errors=errors)
    return validate_schema(schema, arrow_schema(schema), "", base=None)


def declared_sites(sites) -> list[dict]:
    """``[{"site": id, "n_rows": int}, ...]``: distinct ids, positive row counts."""
    if not isinstance(sites, list) or not sites:
        raise InvalidDataset('a federated dataset needs its sites: [{"site": "h1", "n_rows": 1200}, ...]',
                             field="sites")
    if len(sites) > MAX_SITES:
        raise InvalidDataset(f"at most {MAX_SITES:,} sites", field="sites")
    out, seen = [], set()
    for i, s in enumerate(sites):
        if not isinstance(s, dict) or set(s) - {"site", "n_rows"}:
            raise InvalidDataset(f'sites[{i}] must be {{"site": id, "n_rows": rows}}', field="sites")
        site, rows = s.get("site"), s.get("n_rows")
        if not isinstance(site, str) or not SITE_RE.fullmatch(site):
            raise InvalidDataset(f"sites[{i}]: the site id must be 1-100 letters, digits, '.', '-' or '_' "
                                 f"(starting with a letter or digit), got {site!r}", field="sites")
        if site in seen:
            raise InvalidDataset(f"sites[{i}]: site {site!r} is declared twice", field="sites")
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_SITE_ROWS:
            raise InvalidDataset(f"sites[{i}] ({site}): n_rows must be a whole number of rows from 1 to "
                                 f"{MAX_SITE_ROWS:,}, got {rows!r}", field="sites")
        seen.add(site)
        out.append({"site": site, "n_rows": rows})
    return out


def register(*, name: str, created_by, schema, sites, title: str = "", description: str = "",
             unit_column: str = "", budget_epsilon=None, budget_delta="auto", policy: str = "rdp",
             activate: bool = False) -> Dataset:
    """Register a federated dataset: its declared schema and sites, no file (the caller has
    checked the name and the policy). All-or-nothing."""
    if unit_column:
        raise InvalidDataset("a federated dataset has no privacy-unit column yet (the federated engine bounds "
                             "rows)", field="unit_column")
    columns = declared_schema(schema)
    rows = declared_sites(sites)
    n = sum(s["n_rows"] for s in rows)
    eps, delta, delta_auto = parse_budget(budget_epsilon, budget_delta, n)
    digest = hashlib.sha256(json.dumps({"schema": columns, "sites": rows}, sort_keys=True).encode()).hexdigest()
    with transaction.atomic():
        ds = Dataset.objects.create(
            name=name, title=title or name, description=description, file="", file_format="", sha256=digest,
            execution=Dataset.Execution.FEDERATED, schema=columns, unit_column="", n_rows=n, n_units=n,
            max_rows_per_unit=1, budget_epsilon=eps, budget_delta=delta, delta_auto=delta_auto, policy=policy,
            status=Dataset.Status.ACTIVE if activate else Dataset.Status.DRAFT, created_by=created_by)
        Budget.objects.create(dataset=ds)
        trail.record_registration(ds)
        FederatedSite.objects.bulk_create([FederatedSite(dataset=ds, site=s["site"], n_rows=s["n_rows"])
                                           for s in rows])
    return ds
