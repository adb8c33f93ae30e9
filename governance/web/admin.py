"""Django admin: every model, with budget spent/remaining in the list views.

Ledger entries are read-only here: they change only through ``governance.ledger.actions``.
Datasets are registered through the API or ``manage.py registerdataset``; the admin edits
texts and shows the schema and budget.
"""

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.db.models.constants import LOOKUP_SEP
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.html import format_html

from accounting.costs import Cost

from ..core.errors import GrantRevoked, InvalidDataset
from ..datasets import registry as datasets
from ..ledger import grants
from ..ledger.limits import Limit
from ..models import AuditRecord, Budget, Dataset, Grant, LedgerEntry, Request
from .admin_forms import AccountChangeForm, DatasetChangeForm, DatasetRegisterForm, GrantForm, named_in_the_trail
from .progress import progress_text


class SelectedIds:
    """A bulk action's selection must be ids of the list's model: an edited POST with
    ``abc``, ``1.5``, an empty one or an id past 64 bits was a 500 (Django filters the
    queryset by them as they are); it is a 400 saying so, nothing changed."""

    def response_action(self, request, queryset):
        from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
        from django.core.exceptions import ValidationError
        from django.http import HttpResponseBadRequest

        pk = self.model._meta.pk
        try:
            for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
                x = pk.to_python(value)
                if x is None or (isinstance(x, int) and not -(2**63) <= x < 2**63):
                    raise ValidationError("out of range")
        except ValidationError:
            return HttpResponseBadRequest("A selected item is not an id of this list; nothing was changed.",
                                          content_type="text/plain")
        return super().response_action(request, queryset)


class OfficerPermissions(SelectedIds):
    """Privacy officers are staff: they may see and edit governance objects without
    per-model permissions; nothing is ever deleted from here (the ledger needs it)."""

    def _officer(self, request):
        return request.user.is_active and request.user.is_staff

    def has_module_permission(self, request):
        return self._officer(request)

    def has_view_permission(self, request, obj=None):
        return self._officer(request)

    def has_change_permission(self, request, obj=None):
        return self._officer(request)

    def has_add_permission(self, request):
        return self._officer(request)

    def has_delete_permission(self, request, obj=None):
        return False

    def lookup_allowed(self, lookup, value, request=None):
        """Only the lookups of the page's own filters: Django allows one on any local field
        from the query string, and ``?result__icontains=`` on the requests' page read an
        analyst's result, which officers never see, digit by digit (one row or none)."""
        filters = self.get_list_filter(request) if request is not None else self.list_filter
        names = {self.date_hierarchy} | {f[0] if isinstance(f, (list, tuple)) else getattr(f, "parameter_name", f)
                                         for f in filters}
        return lookup.split(LOOKUP_SEP)[0] in names and super().lookup_allowed(lookup, value, request)


class ReadOnly(OfficerPermissions):
    """View only: ledger entries, requests and audit records change through the service."""

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def _spent(state, limit: Limit) -> str:
    spent = limit.spent(Cost.from_json(state))
    return f"{spent:.4g} / {limit.epsilon:g}" if spent != float("inf") else f"inf / {limit.epsilon:g}"


class SaveRefusable:
    """An edit ``save_model`` refused under the ledger's lock (``request._save_refused``: a
    budget below what is spent, a grant revoked meanwhile): back to the form with the error,
    without "changed successfully" and without a change in the object's history."""

    def log_change(self, request, obj, message):
        if not getattr(request, "_save_refused", False):
            return super().log_change(request, obj, message)
        return None

    def response_change(self, request, obj):
        if getattr(request, "_save_refused", False):
            return redirect(request.path)
        return super().response_change(request, obj)


@admin.register(Dataset)
class DatasetAdmin(SaveRefusable, OfficerPermissions, admin.ModelAdmin):
    """Registering (upload or server path) infers the schema; edits go through datasets.update."""

    form = DatasetChangeForm
    list_display = ("name", "overview", "status", "policy", "n_units", "budget_epsilon", "budget_delta", "spent",
                    "remaining")
    list_filter = ("status", "policy")
    search_fields = ("name", "title")
    readonly_fields = ("overview", "name", "status", "policy", "unit_column", "n_rows", "n_units", "max_rows_per_unit",
                       "file", "file_format", "sha256", "budget_delta", "delta_auto", "created_by", "created_at")
    fields = ("overview", "name", "title", "description", "status", "schema", "budget_epsilon", "budget_delta_text",
              "policy", "approx_delta_share", "pld_certification", "allow_non_private", "release_quantum_ms", "unit_column", "n_rows", "n_units", "max_rows_per_unit", "budget_delta", "delta_auto",
              "file", "file_format", "sha256", "created_by", "created_at")
    actions = ["activate", "deactivate"]

    def get_urls(self):
        return [path("register/", self.admin_site.admin_view(self.register_view),
                     name="governance_dataset_register")] + super().get_urls()

    def add_view(self, request, form_url="", extra_context=None):
        return redirect("admin:governance_dataset_register")

    def register_view(self, request):
        if not self.has_add_permission(request):
            return redirect("admin:index")
        form = DatasetRegisterForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            ds = form.register(request.user)
            if ds is not None:
                messages.success(request, f"Registered {ds.name} as a draft: review the schema, then activate it.")
                return redirect(reverse("admin:governance_dataset_change", args=[ds.pk]))
        context = {**self.admin_site.each_context(request), "form": form, "opts": self.model._meta}
        return render(request, "admin/governance/dataset/register.html", context)

    def save_model(self, request, obj, form, change):
        try:
            datasets.update(obj, actor=request.user.get_username(), **form.edited())
        except InvalidDataset as e:
            errors = e.extra.get("errors") or {}
            messages.error(request, e.detail + (" " + "; ".join(f"{k}: {v}" for k, v in errors.items())))
            request._save_refused = True  # checked under the ledger's lock, so not a form error

    @admin.action(description="Activate (schema reviewed)")
    def activate(self, request, queryset):
        n = queryset.filter(status=Dataset.Status.DRAFT).update(status=Dataset.Status.ACTIVE)  # not pending/failed
        messages.success(request, f"Activated {n} dataset(s).")

    @admin.action(description="Take out of service (back to draft: no requests; queued ones refunded)")
    def deactivate(self, request, queryset):
        n = sum(datasets.take_out_of_service(ds) for ds in queryset.filter(status=Dataset.Status.ACTIVE))
        messages.success(request, f"Took {n} dataset(s) out of service: activate them again to reopen.")

    @admin.display(description="overview")
    def overview(self, ds):
        return format_html('<a href="{}">budget, ledger, audit</a>', reverse("admin:governance_overview", args=[ds.pk]))

    @admin.display(description="epsilon spent (policy filter)")
    def spent(self, ds):
        return _spent(ds.budget.state, Limit.of_dataset(ds))

    @admin.display(description="epsilon remaining")
    def remaining(self, ds):
        limit = Limit.of_dataset(ds)
        return f"{max(0.0, limit.epsilon - limit.spent(Cost.from_json(ds.budget.state))):.4g}"


@admin.register(Budget)
class BudgetAdmin(OfficerPermissions, admin.ModelAdmin):
    list_display = ("dataset", "active_entries", "spent", "updated_at")
    readonly_fields = ("dataset", "state", "active_entries", "updated_at")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="epsilon spent / budget")
    def spent(self, b):
        return _spent(b.state, Limit.of_dataset(b.dataset))


@admin.register(Grant)
class GrantAdmin(SaveRefusable, OfficerPermissions, admin.ModelAdmin):
    form = GrantForm
    list_display = ("analyst", "dataset", "cap_epsilon", "cap_delta", "spent", "revoked_at")
    list_filter = ("dataset",)
    fields = ("analyst", "dataset", "cap_epsilon", "cap_delta", "revoked_at", "created_by", "created_at")
    readonly_fields = ("revoked_at", "created_by", "created_at")
    actions = ["revoke"]

    def get_readonly_fields(self, request, obj=None):
        # Who and what a grant is for never changes; only the cap does, while it is active
        # (a revoked grant is given again, with its cap, from "add grant")
        if obj is not None and not obj.active:
            return self.fields
        return self.readonly_fields + (("analyst", "dataset") if obj else ())

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "analyst":  # as the API: officers need no grant, auditors may hold none
            from ..core.roles import AUDITORS_GROUP

            kwargs["queryset"] = (db_field.remote_field.model.objects.filter(is_staff=False, is_active=True)
                                  .exclude(groups__name=AUDITORS_GROUP).order_by("username"))
        if db_field.name == "dataset":  # grants.give refuses a table not registered (yet)
            kwargs["queryset"] = db_field.remote_field.model.objects.exclude(status__in=grants.UNREGISTERED)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    @admin.action(description="Revoke (keeps the grant's history)")
    def revoke(self, request, queryset):
        n = sum(grants.revoke(g, request.user) for g in queryset.filter(revoked_at__isnull=True))
        messages.success(request, f"Revoked {n} grant(s).")

    def save_model(self, request, obj, form, change):
        """Through ``governance.ledger.grants`` (a ``grant`` record in the dataset's audit
        chain): a new grant (the form refused a second one for the pair), or only the cap."""
        if not change:
            grant = grants.give(obj.analyst, obj.dataset, request.user, cap_epsilon=obj.cap_epsilon,
                                cap_delta=obj.cap_delta)
            grant = grant or Grant.objects.get(analyst=obj.analyst, dataset=obj.dataset)  # (given meanwhile)
            obj.pk, obj.created_by, obj.created_at = grant.pk, grant.created_by, grant.created_at
        else:
            try:
                grants.change_cap(obj, request.user, **{f: form.cleaned_data[f] for f in form.changed_data
                                                         if f in ("cap_epsilon", "cap_delta")})
            except GrantRevoked as e:  # revoked meanwhile, by another officer
                messages.error(request, e.detail)
                request._save_refused = True


    @admin.display(description="epsilon spent by analyst")
    def spent(self, g):
        ds = g.dataset
        limit = Limit.of_grant(g, ds) or Limit.of_dataset(ds)
        return _spent(g.state, limit)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ("id", "dataset", "analyst", "status", "reference", "created_at", "committed_at")
    list_filter = ("status", "dataset")
    search_fields = ("reference",)


@admin.register(Request)
class RequestAdmin(ReadOnly, admin.ModelAdmin):
    """Requests with status and progress. Results are the analyst's: not shown here."""

    list_display = ("created_at", "analyst", "dataset", "engine", "kind", "status", "phase", "finished_at")
    list_filter = ("status", "engine", "dataset")
    search_fields = ("id", "analyst__username")
    fields = ("id", "analyst", "dataset", "engine", "kind", "params", "status", "progress", "error", "worker",
              "ledger_entry", "replay_of", "created_at", "started_at", "finished_at")

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*Request.LARGE)  # (a result of 7 MB, decoded per row listed)

    @admin.display(description="progress")
    def phase(self, r):
        return progress_text(r.progress)


@admin.register(AuditRecord)
class AuditRecordAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ("dataset", "seq", "at", "action", "outcome", "actor", "engine", "kind", "short_hash")
    list_filter = ("action", "outcome", "dataset")
    search_fields = ("actor", "reference", "request_id")

    @admin.display(description="hash")
    def short_hash(self, rec):
        return rec.hash[:12]


User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class AccountAdmin(SelectedIds, UserAdmin):
    """Django's user admin, with the username fixed once the account exists: every audit
    record names its actor by username, and ``audit verify`` compares a release's record
    with its ledger entry's analyst; a rename made each dataset she used fail verification."""

    form = AccountChangeForm  # (new accounts: the username rule is the model field's, core.roles)

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields + ("username",) if obj is not None else fields

    def has_delete_permission(self, request, obj=None):
        """An account an audit record names is deactivated, never deleted: its username
        could then be given to a new account, and the trail would credit that one with
        what it records (a probe's deleted officer's budget change, read as an analyst's).
        The bulk action refuses a selection holding one (Django asks this of each)."""
        if obj is not None and named_in_the_trail(obj):
            return False
        return super().has_delete_permission(request, obj)



if admin.site.is_registered(Group):
    admin.site.unregister(Group)


@admin.register(Group)
class RoleAdmin(SelectedIds, GroupAdmin):
    """Django's group admin (the auditors' group), its bulk actions' selection checked."""
