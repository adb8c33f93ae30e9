"""The analyst's page: their datasets, what is left of their budget under each
accountant, and their requests. Analysts hold API tokens, not passwords: they sign in
here with their token (POST, CSRF-protected), which opens a session for this page only.
Results stay behind the API (``GET /api/requests/{id}/``)."""

from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib.auth import login, logout
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from rest_framework.authtoken.models import Token

from accounting.costs import Cost
from ..core.roles import role_of
from ..ledger.limits import Limit, budget_report
from ..models import Dataset, Grant, Request


class TokenLoginForm(forms.Form):
    token = forms.CharField(max_length=100, widget=forms.PasswordInput, label="API token")

    def clean_token(self):
        token = Token.objects.select_related("user").filter(key=self.cleaned_data["token"].strip()).first()
        if token is None or not token.user.is_active:
            raise forms.ValidationError("Unknown token.")
        expires = token_expires(token)
        if expires is not None and expires <= timezone.now():
            raise forms.ValidationError("This token expired; ask a privacy officer for a new one.")
        if token.user.is_staff:
            # an API token is not the officer's password: it must not open the admin
            raise forms.ValidationError("Privacy officers sign in at /admin/ with their password.")
        return token


def token_expires(token):
    """When an API token stops working (API_TOKEN_TTL_DAYS after issue; None: never)."""
    ttl = settings.API_TOKEN_TTL_DAYS
    return token.created + timedelta(days=ttl) if ttl else None


def token_login(request):
    form = TokenLoginForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        token = form.cleaned_data["token"]
        login(request, token.user, backend="django.contrib.auth.backends.ModelBackend")
        expires = token_expires(token)
        if expires is not None:  # the session ends with the token (revoking it ends it too: api/access_views.py)
            request.session.set_expiry(min(expires, request.session.get_expiry_date()))
        return redirect("analyst-home")
    return render(request, "governance/analyst_login.html", {"form": form})


@require_POST
def token_logout(request):
    logout(request)
    return redirect("analyst-login")


@login_required(login_url="analyst-login")
def home(request):
    user = request.user
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
    requests_ = Request.objects.filter(analyst=user).select_related("dataset").order_by("-created_at")[:50]
    return render(request, "governance/analyst.html", {"rows": rows, "requests": requests_, "role": role_of(user)})
