"""The auditor's pages: every dataset's audit chain (its head, its records), the trail of
one dataset with filters, a verification of the chains against the ledger, and the
exports (JSON re-verifiable with tools/recompose_audit.py, CSV, the PDF report). Read-only:
an auditor sees audit records and releases' charges, never a request's result, a row or a
grant's analyst beyond the records' actor names. Auditors sign in with their API token at
/analyst/login/ (``analyst_views``); analysts are refused here (403)."""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, render

from ..audit import export as audit_export, verification
from ..core.roles import is_auditor, role_of
from ..models import AuditRecord, Dataset
from .analyst_views import token_context
from .paging import filtered, page

FORMATS = audit_export.EXPORT_FORMATS


def auditors_only(view):
    @login_required(login_url="analyst-login")
    @wraps(view)
    def guarded(request, *args, **kwargs):
        if not is_auditor(request.user):
            return HttpResponseForbidden("These pages are the auditors'.", content_type="text/plain")
        return view(request, *args, **kwargs)
    return guarded


def _context(request, **more) -> dict:
    return {"role": role_of(request.user), **token_context(request.user), **more}


@auditors_only
def home(request):
    datasets = Dataset.objects.select_related("budget").order_by("name")
    return render(request, "governance/auditor.html", _context(request, datasets=datasets, formats=FORMATS))


@auditors_only
def trail(request, name):
    ds = get_object_or_404(Dataset.objects.select_related("budget"), name=name)
    records = page(request, "page", filtered(AuditRecord.objects.filter(dataset=ds).order_by("-seq"), request,
                                             {"action": "action", "actor": "actor", "outcome": "outcome"}), 50)
    return render(request, "governance/auditor_trail.html", _context(
        request, ds=ds, records=records, actions=AuditRecord.Action.values, formats=FORMATS))


@auditors_only
def verify(request):
    """Re-hash the chains (one dataset with ?dataset=NAME, else all) and check them against
    the ledger: every problem listed, not only the first."""
    names = request.GET.getlist("dataset")
    try:
        datasets = audit_export.datasets_named(names) if names else None
    except LookupError as e:
        return HttpResponse(str(e), status=404, content_type="text/plain")
    result = verification.verify(datasets, stop_at_first=False)
    return render(request, "governance/auditor_verify.html", _context(request, result=result, names=names))


@auditors_only
def export(request):
    return audit_export.page_response(request.GET.getlist("dataset"), request.user, request.GET.get("format", "pdf"))
