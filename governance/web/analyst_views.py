"""The pages of analysts and auditors, who hold API tokens, not passwords: they sign in
here with their token (POST, CSRF-protected), which opens a session for these pages only.
An analyst's home lists their datasets, what is left of their budget under each
accountant, and their requests; an auditor's pages are in ``auditor_views``. Either may
issue themselves a new token (the old one stops working). Results stay behind the API
(``GET /api/requests/{id}/``)."""

from django import forms
from django.contrib.auth import login, logout
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from rest_framework.authtoken.models import Token

from accounting.costs import Cost

from ..core import tokens
from ..core.roles import is_auditor, role_of
from ..ledger.limits import Limit, budget_report
from ..models import Dataset, Grant, Request


class TokenLoginForm(forms.Form):
    token = forms.CharField(max_length=100, widget=forms.PasswordInput, label="API token")

    def clean_token(self):
        token = Token.objects.select_related("user").filter(key=self.cleaned_data["token"].strip()).first()
        if token is None or not token.user.is_active:
            raise forms.ValidationError("Unknown token.")
        expires = tokens.expires(token)
        if expires is not None and expires <= timezone.now():
            raise forms.ValidationError("This token expired; ask a privacy officer for a new one.")
        if token.user.is_staff:
            # an API token is not the officer's password: it must not open the admin
            raise forms.ValidationError("Privacy officers sign in at /admin/ with their password.")
        return token


def _session_ends_with(request, token) -> None:
    """The session ends with the token (revoking it ends it too: ``core.tokens.revoke``),
    and never opens the admin (``admin_site``), even once its account is made staff."""
    request.session[tokens.SESSION_KEY] = True
    expires = tokens.expires(token)
    if expires is not None:
        request.session.set_expiry(min(expires, request.session.get_expiry_date()))


def token_login(request):
    form = TokenLoginForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        token = form.cleaned_data["token"]
        login(request, token.user, backend="django.contrib.auth.backends.ModelBackend")
        _session_ends_with(request, token)
        return redirect("auditor-home" if is_auditor(token.user) else "analyst-home")
    return render(request, "governance/analyst_login.html", {"form": form})


@require_POST
def token_logout(request):
    logout(request)
    return redirect("analyst-login")


@login_required(login_url="analyst-login")
@require_POST
def new_token(request):
    """Issue the signed-in analyst or auditor a new API token, shown once on this page; the
    old one stops working at once. The session goes on (it is opened again with the new
    token, ending when it does)."""
    user = request.user
    token = tokens.issue(user)  # ends the sessions opened with the old token, this one too...
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")  # ...so open it again
    _session_ends_with(request, token)
    return render(request, "governance/token.html", {"token": token, "expires": tokens.expires(token),
                                                     "role": role_of(user), "back": "auditor-home"
                                                     if is_auditor(user) else "analyst-home"})


@login_required(login_url="analyst-login")
def home(request):
    user = request.user
    if is_auditor(user):
        return redirect("auditor-home")
    rows = []
    for g in Grant.objects.filter(analyst=user, revoked_at__isnull=True, dataset__status=Dataset.Status.ACTIVE
                                  ).select_related("dataset", "dataset__budget"):
        ds = g.dataset
        limit = Limit.of_grant(g, ds)
        mine = budget_report(Cost.from_json(g.state), limit or Limit.of_dataset(ds))[ds.policy]
        whole = budget_report(Cost.from_json(ds.budget.state), Limit.of_dataset(ds))[ds.policy]
        rows.append({"ds": ds, "cap": g.cap_epsilon, "mine": mine, "dataset": whole,
                     "left": min(float(mine["remaining_epsilon"]) if limit else float("inf"),
                                 float(whole["remaining_epsilon"]))})
    requests_ = (Request.objects.filter(analyst=user).select_related("dataset").defer(*Request.LARGE)
                 .order_by("-created_at")[:50])
    return render(request, "governance/analyst.html", {"rows": rows, "requests": requests_, "role": role_of(user),
                                                       **token_context(user)})


def token_context(user) -> dict:
    """The signed-in user's token card: when their token was issued and stops working."""
    token = tokens.current(user)
    return {"token": token, "token_expires": tokens.expires(token) if token else None}
