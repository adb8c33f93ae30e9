"""``manage.py federated``: register a federated dataset, list its sites, hand a site its secret."""

import os
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from ...core import json_text
from ...core.errors import GovernanceError
from ...datasets import federated, registry
from ...models import Dataset


def _json_arg(value: str, what: str):
    """JSON text, or @path of a JSON file."""
    try:
        text = Path(value[1:]).read_text(encoding="utf-8") if value.startswith("@") else value
        return json_text.loads(text)
    except (OSError, ValueError) as e:  # (UnicodeDecodeError and json_text's limits are ValueErrors)
        raise CommandError(f"{what}: not JSON text nor @file of JSON ({str(e)[:200]})") from None


def _site_arg(value: str) -> dict:
    site, sep, rows = value.partition("=")
    try:
        return {"site": site, "n_rows": int(rows)} if sep else {"site": site, "n_rows": None}
    except ValueError:
        raise CommandError(f"--site {value!r}: give SITE=ROWS (e.g. h1=1200)") from None


class Command(BaseCommand):
    help = ("Federated datasets (their rows stay at their sites): 'register' one from its declared schema and "
            "sites, list its 'sites', hand a site its 'secret' (derived from SECRET_KEY, never stored; the site "
            "agent's --key).")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="{register,sites,secret}")
        reg = sub.add_parser("register", help="register a federated dataset: schema and sites, no table")
        reg.add_argument("name", help="the dataset's name (a lowercase slug)")
        reg.add_argument("--schema", required=True,
                         help='declared columns: JSON or @file, [{"name", "type", "lower", "upper", "domain"}, ...] '
                              "(every column with its type; nothing is read from the rows)")
        reg.add_argument("--sites", help='JSON or @file: [{"site": "h1", "n_rows": 1200}, ...]')
        reg.add_argument("--site", action="append", default=[], metavar="SITE=ROWS",
                         help="one site and its row count (repeatable; instead of --sites)")
        reg.add_argument("--budget-epsilon", type=float, required=True, help="the dataset's epsilon budget")
        reg.add_argument("--budget-delta", default="auto", help='a number below 1/n and 0.1, or "auto" (1/n^1.2, at most 0.001)')
        reg.add_argument("--policy", default="rdp", help="the accountant that gates: rdp, basic or advanced")
        reg.add_argument("--title", default="")
        reg.add_argument("--officer", help="the privacy officer registering it (default: the first officer)")
        reg.add_argument("--activate", action="store_true", help="open it to requests at once (skip the draft)")
        sites = sub.add_parser("sites", help="list a federated dataset's sites")
        sites.add_argument("name")
        sec = sub.add_parser("secret", help="print a site's secret (or write it to a 0600 file with --out)")
        sec.add_argument("name")
        sec.add_argument("site")
        sec.add_argument("--out", help="write the secret to this file (mode 0600) instead of printing it")

    def handle(self, *args, action, **o):
        try:
            getattr(self, f"do_{action}")(**o)
        except GovernanceError as e:
            errors = e.extra.get("errors") or {}
            raise CommandError(e.detail + "".join(f" {k}: {v}" for k, v in errors.items())) from None

    def _dataset(self, name) -> Dataset:
        ds = Dataset.objects.filter(name=name).first()
        if ds is None or ds.execution != Dataset.Execution.FEDERATED:
            raise CommandError(f"no federated dataset named {name!r}")
        return ds

    def do_register(self, *, name, schema, sites, site, budget_epsilon, budget_delta, policy, title, officer,
                    activate, **_):
        if (sites is None) == (not site):
            raise CommandError("give the sites with --sites or with --site SITE=ROWS (one per site)")
        declared = _json_arg(sites, "--sites") if sites is not None else [_site_arg(s) for s in site]
        users = get_user_model().objects.filter(is_staff=True, is_active=True)
        by = users.filter(username=officer).first() if officer else users.order_by("id").first()
        if by is None:
            raise CommandError("no such privacy officer (an active staff user)" if officer else
                               "no privacy officer yet: create one (manage.py createsuperuser)")
        ds = registry.register(name=name, created_by=by, schema=_json_arg(schema, "--schema"), title=title,
                               budget_epsilon=budget_epsilon, budget_delta=budget_delta, policy=policy,
                               activate=activate, execution=Dataset.Execution.FEDERATED, sites=declared)
        self.stdout.write(f"registered federated dataset {ds.name} ({ds.status}): {ds.n_rows:,} rows over "
                          f"{len(declared)} sites, budget epsilon {ds.budget_epsilon:g}, delta {ds.budget_delta:.3g}")
        self.stdout.write(f"hand each site its secret: manage.py federated secret {ds.name} SITE --out SITE.secret")

    def do_sites(self, *, name, **_):
        ds = self._dataset(name)
        for s in ds.sites.order_by("id"):
            issued = s.secret_issued_at.isoformat(timespec="seconds") if s.secret_issued_at else "never"
            self.stdout.write(f"{s.site:<24} {s.n_rows:>12,} rows   secret handed out: {issued}")

    def do_secret(self, *, name, site, out, **_):
        ds = self._dataset(name)
        if not out:
            self.stdout.write(federated.issue_secret(ds, site, "manage.py"))
            return
        try:  # the file opened first: a path that cannot be written issues no secret
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as e:
            raise CommandError(f"cannot write {out}: {e.strerror}") from None
        secret = federated.issue_secret(ds, site, "manage.py")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secret)
        except OSError as e:
            raise CommandError(f"the new secret of {site} was issued but could not be written to {out} "
                               f"({e.strerror}); issue it again to another file") from None
        self.stdout.write(f"wrote {site}'s secret to {out} (mode 0600): the site agent takes --key @{out}")
