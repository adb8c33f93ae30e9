"""The privacy officer's web UI: the Django admin with a budget dashboard as its index,
a page per dataset (gauges, burn-down, grants, requests, ledger, audit trail, estimate
tool, exports) and audit exports. Server-rendered; the charts are inline SVG."""

from __future__ import annotations

import json
import math
import re

from django.contrib import admin, messages
from django.contrib.auth import get_user_model, user_logged_in
from django.db.models import Count, F, Q
from django.db.models.functions import Greatest, Mod
from django.dispatch import receiver
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import mark_safe

from accounting import ACCOUNTANTS
from accounting.costs import Cost

from ..audit import export as audit_export, verification
from ..core import json_text, liveness, tokens
from ..core.roles import role_of, with_auditor_flag
from ..core.errors import GovernanceError, InvalidRequest
from ..ledger import actions as ledger, estimates, limits, refined_reports
from ..models import AuditRecord, Dataset, Grant, LedgerEntry, Request
from ..requests import sql as sql_requests
from . import charts
from .paging import filtered, page
from .progress import progress_text

User = get_user_model()
SPARK_POINTS = 40
ESTIMATE_KINDS = {  # what the estimate tool takes, with the example it starts from
    "event": '{"kind": "laplace", "epsilon": 0.1}',
    "request": '{"engine": "aggregates", "kind": "count", "params": {"epsilon": 0.1}}',
    "sql": 'SELECT COUNT(*) FROM "DATASET"',
}
CHART_POINTS = 600


@receiver(user_logged_in)
def _a_login_starts_afresh(sender, request, user, **kwargs):
    """Any sign-in drops the token mark (``tokens.SESSION_KEY``: Django keeps a session's
    data when the same user signs in again); /analyst/login/ sets it again after."""
    if request is not None and hasattr(request, "session"):
        request.session.pop(tokens.SESSION_KEY, None)


class GovernanceAdminSite(admin.AdminSite):
    site_header = "Privacy-budget governance"
    site_title = "Privacy governance"
    index_title = "Budget dashboard"
    index_template = "admin/governance/dashboard.html"

    def has_permission(self, request):
        # a session opened with an API token is an analyst's or auditor's: made staff since,
        # it opened the admin (its token pages included) to whoever held the token (probe CO)
        return request.user.is_active and request.user.is_staff and not request.session.get(tokens.SESSION_KEY)

    def register(self, model_or_iterable, admin_class=None, **options):
        """Every model but API tokens: DRF's ``TokenAdmin`` (registered by
        ``rest_framework.authtoken``) lists every analyst's and auditor's key in clear to a
        superuser, who could then read their results as them. A token is shown once, when
        it is issued (``api_token``, ``/api/analysts/{id}/token/``)."""
        from rest_framework.authtoken.models import Token, TokenProxy

        models = model_or_iterable if isinstance(model_or_iterable, (list, tuple)) else [model_or_iterable]
        models = [m for m in models if m not in (Token, TokenProxy)]
        if models:
            super().register(models, admin_class, **options)

    def get_urls(self):
        view = self.admin_view
        return [
            path("governance/dataset/<int:pk>/overview/", view(self.dataset_overview), name="governance_overview"),
            path("governance/audit/export/", view(self.audit_export), name="governance_audit_export"),
            path("governance/audit/verify/", view(self.audit_verify), name="governance_audit_verify"),
            path("governance/token/", view(self.api_token), name="governance_token"),
        ] + super().get_urls()

    # ------------------------------------------------------------------ dashboard

    def index(self, request, extra_context=None):
        datasets = list(Dataset.objects.select_related("budget").annotate(
            n_grants=Count("grants", filter=Q(grants__revoked_at__isnull=True))).order_by("name"))
        sparks = _series(datasets, SPARK_POINTS)
        rows = []
        for ds in datasets:
            limit = ledger.Limit.of_dataset(ds)
            state = Cost.from_json(ds.budget.state)
            spent = limit.spent(state)
            cap = ds.budget_epsilon
            rows.append({
                "ds": ds, "spent": spent, "remaining": max(0.0, cap - spent) if math.isfinite(spent) else 0.0,
                "gauge": mark_safe(charts.gauge(spent, cap, label=ds.name)),
                "spark": mark_safe(charts.burndown(sparks.get(ds.pk, []), cap, width=160, height=36,
                                                   accountants=(ds.policy,), compact=True)),
                "near_cap": spent >= 0.9 * cap, "releases": ds.budget.audit_seq, "active": ds.budget.active_entries,
                "url": reverse("admin:governance_overview", args=[ds.pk]),
            })
        totals = {"datasets": len(rows), "near_cap": sum(r["near_cap"] for r in rows),
                  "running": Request.objects.filter(status__in=["queued", "running"]).count()}
        # a worker that died is visible here (governance.core.liveness: one HGETALL or directory listing)
        workers = liveness.summary()
        return super().index(request, {"rows": rows, "totals": totals, "workers": workers,
                                       **(extra_context or {})})

    # ------------------------------------------------------------------ one dataset

    def dataset_overview(self, request, pk):
        ds = get_object_or_404(Dataset.objects.select_related("budget"), pk=pk)
        state = Cost.from_json(ds.budget.state)
        limit = ledger.Limit.of_dataset(ds)
        # rdp's plain composition refined off the grid (the events of the dataset's entries)
        report = limits.budget_report(state, limit, refined_reports.active_event(ds))
        gauges = [{"name": name, "gates": r["gates"], "theorem": ACCOUNTANTS[name].THEOREM,
                   "plain": _float(r.get("refined_epsilon", r["epsilon"])),
                   "price": r.get("refined_filter_price_epsilon", r["filter_price_epsilon"]),
                   "svg": mark_safe(charts.gauge(_float(r["filter_epsilon"]), ds.budget_epsilon, width=260,
                                                 label=name, alarm=r["gates"]))} for name, r in report.items()]
        chart = mark_safe(charts.burndown(_series([ds], CHART_POINTS).get(ds.pk, []), ds.budget_epsilon))
        grants = [{"g": g, "spent": ledger.Limit.of_grant(g, ds) or limit} for g in
                  Grant.objects.filter(dataset=ds).select_related("analyst").order_by("revoked_at", "analyst__username")]
        for row in grants:
            row["spent"] = row["spent"].spent(Cost.from_json(row["g"].state))
        ledger_page = page(request, "lpage", filtered(LedgerEntry.objects.filter(dataset=ds).select_related(
            "analyst").order_by("-id"), request, {"lstatus": "status", "lanalyst": "analyst__username"}))
        audit_page = page(request, "apage", filtered(AuditRecord.objects.filter(dataset=ds).order_by("-seq"),
                                                       request, {"action": "action", "actor": "actor",
                                                                 "outcome": "outcome"}))
        for rec in audit_page:  # each release's rdp charge also refined off the grid (a page: <= 3 ms each)
            rec.refined_rdp = None
            at = (rec.totals or {}).get("at_delta")
            if rec.action == AuditRecord.Action.COMMIT and rec.event is not None and isinstance(at, float):
                try:
                    rec.refined_rdp = refined_reports.event_refined(rec.event, at)["refined_epsilon"]
                except ValueError:  # an unreadable event: audit verify names it
                    pass
        requests_ = (Request.objects.filter(dataset=ds).select_related("analyst").defer(*Request.LARGE)
                     .order_by("-created_at")[:20])
        for r in requests_:
            r.progress_text = progress_text(r.progress)
        sites = list(ds.sites.order_by("id")) if ds.execution == Dataset.Execution.FEDERATED else []
        estimate = self._estimate(request, ds)
        context = {
            **self.each_context(request), "title": f"Dataset {ds.name}", "ds": ds, "gauges": gauges, "chart": chart,
            "report": report, "grants": grants, "ledger_page": ledger_page, "audit_page": audit_page,
            "requests": requests_, "sites": sites, "estimate": estimate, "filters": request.GET,
            "statuses": LedgerEntry.Status.values, "actions": AuditRecord.Action.values,
            "export_url": reverse("admin:governance_audit_export"),
            "verify_url": reverse("admin:governance_audit_verify") + f"?dataset={ds.name}",
            "opts": Dataset._meta,
        }
        return render(request, "admin/governance/dataset_overview.html", context)

    def _estimate(self, request, ds):
        """The estimate tool: an event (or JSON list of events), a request (JSON with engine,
        kind and params) or a SQL query with its options, priced as the API's estimate would."""
        what = request.GET.get("what", "event")
        raw = request.GET.get("event", "").strip()
        options = request.GET.get("options", "").strip() or '{"epsilon": 0.1}'
        what = what if what in ESTIMATE_KINDS else "event"
        out = {"what": what, "raw": raw or ESTIMATE_KINDS[what].replace("DATASET", ds.name), "options": options,
               "kinds": ESTIMATE_KINDS}
        if not raw:
            return out
        try:
            if what == "sql":
                out["result"] = sql_requests.price(ds, request.user, sql=raw, params=json_text.loads(options))
            elif what == "request":
                asked = json_text.loads(raw)
                if not (isinstance(asked, dict) and isinstance(asked.get("engine", "aggregates"), str)
                        and isinstance(asked.get("kind"), str) and isinstance(asked.get("params", {}), dict)):
                    raise InvalidRequest("a request is a JSON object with engine and kind (strings) and params "
                                         "(an object)")
                out["result"] = sql_requests.price(ds, request.user, engine=asked.get("engine", "aggregates"),
                                                   kind=asked.get("kind"), params=asked.get("params", {}))
            else:
                out["result"] = estimates.estimate(ds, request.user, json_text.loads(raw))
        except ValueError as e:  # json_text: not JSON, or past the API's limits
            out["error"] = str(e)
        except GovernanceError as e:
            errors = e.extra.get("errors")
            out["error"] = e.detail + (f" ({json.dumps(errors, default=str)[:500]})" if errors else "")
        return out

    # ------------------------------------------------------------------ API tokens

    def api_token(self, request):
        """The officer's own API token and those of analysts and auditors: each issued here
        (shown once; the old one stops working), never displayed again."""
        issued = None
        if request.method == "POST":
            who = request.POST.get("for", "")
            if who != "me" and not re.fullmatch(r"[0-9]{1,18}", who):
                return HttpResponse("for must be me or a user's id", status=400, content_type="text/plain")
            target = request.user if who == "me" else get_object_or_404(User, pk=int(who), is_staff=False,
                                                                          is_active=True)
            token = tokens.issue(target, by=request.user)
            issued = {"user": target, "key": token.key, "expires": tokens.expires(token)}
        mine = tokens.current(request.user)
        users = list(with_auditor_flag(User.objects.filter(is_staff=False, is_active=True)).order_by("username")
                     .select_related("auth_token"))
        users = [{"u": u, "role": role_of(u), "token": getattr(u, "auth_token", None)} for u in users]
        return render(request, "admin/governance/token.html", {
            **self.each_context(request), "title": "API tokens", "issued": issued, "mine": mine,
            "mine_expires": tokens.expires(mine) if mine else None, "users": users})

    # ------------------------------------------------------------------ audit

    def audit_export(self, request):
        return audit_export.page_response(request.GET.getlist("dataset"), request.user,
                                          request.GET.get("format", "pdf"))

    def audit_verify(self, request):
        messages.add_message(request, *self._verified(request.GET.getlist("dataset")))
        target = request.GET.get("next", "")
        if not target.startswith("/") or not url_has_allowed_host_and_scheme(
                target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
            # a path only: redirect() reads any other word as a view's name (NoReverseMatch, a 500)
            target = reverse("admin:index")
        return redirect(target)


    @staticmethod
    def _verified(names) -> tuple[int, str]:
        """The verify button's message: as the exports, "all" or no name is every dataset,
        and an unknown name is said, not skipped (a typo verified nothing and said success)."""
        try:
            result = verification.verify(audit_export.datasets_named(names))
        except LookupError as e:
            return messages.ERROR, f"Audit chain not verified: {e}."
        if not result.ok:
            return messages.ERROR, f"Audit chain BROKEN: {result.first_broken}"
        return messages.SUCCESS, f"Audit chain verified: {result.records} record{'s' * (result.records != 1)} " \
                                 "agree with the ledger."


def _float(x) -> float:
    return float(x) if not isinstance(x, str) else math.inf


def _series(datasets, points: int) -> dict:
    """{dataset id: [(unix time, {accountant: committed epsilon})]}: about ``points`` of
    each dataset's commit records (every k-th by sequence number, and the last one), read
    in one query."""
    ids = [d.pk for d in datasets]
    if not ids:
        return {}
    qs = (AuditRecord.objects.filter(dataset_id__in=ids, action=AuditRecord.Action.COMMIT)
          .annotate(step=Greatest(F("dataset__budget__audit_seq") / points, 1))
          .annotate(m=Mod(F("seq"), F("step")))
          .filter(Q(m=0) | Q(seq=F("dataset__budget__audit_seq")))
          .order_by("dataset_id", "seq").values_list("dataset_id", "at", "totals"))
    out: dict = {}
    for ds_id, at, totals in qs:
        out.setdefault(ds_id, []).append(
            (at.timestamp(), {k: _float(v["epsilon"]) for k, v in totals.items() if isinstance(v, dict)}))
    created = {d.pk: d.created_at.timestamp() for d in datasets}
    for ds_id, points in out.items():  # every line starts at zero when the dataset was registered
        points.insert(0, (min(created[ds_id], points[0][0]), dict.fromkeys(points[0][1], 0.0)))
    return out
