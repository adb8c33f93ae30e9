"""Django admin: every model, with budget spent/remaining in the list views.

Ledger entries are read-only here: they change only through ``governance.ledger``.
Datasets are registered through the API or ``manage.py registerdataset``; the admin edits
texts and shows the schema and budget.
"""

from django.contrib import admin

from .accounting.costs import Cost
from .ledger import Limit
from .models import Budget, Dataset, Grant, LedgerEntry


def _spent(state, limit: Limit) -> str:
    spent = limit.spent(Cost.from_json(state))
    return f"{spent:.4g} / {limit.epsilon:g}" if spent != float("inf") else f"inf / {limit.epsilon:g}"


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "status", "policy", "n_units", "budget_epsilon", "budget_delta", "spent", "remaining")
    list_filter = ("status", "policy")
    search_fields = ("name", "title")
    readonly_fields = ("file", "file_format", "sha256", "n_rows", "n_units", "max_rows_per_unit", "created_by",
                       "created_at", "budget_epsilon", "budget_delta", "delta_auto", "policy", "schema", "unit_column")
    fields = ("name", "title", "description", "status") + readonly_fields

    def has_add_permission(self, request):
        return False  # register through the API or `manage.py registerdataset` (schema inference)

    @admin.display(description="epsilon spent (policy filter)")
    def spent(self, ds):
        return _spent(ds.budget.state, Limit.of_dataset(ds))

    @admin.display(description="epsilon remaining")
    def remaining(self, ds):
        limit = Limit.of_dataset(ds)
        return f"{max(0.0, limit.epsilon - limit.spent(Cost.from_json(ds.budget.state))):.4g}"


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
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
class GrantAdmin(admin.ModelAdmin):
    list_display = ("analyst", "dataset", "cap_epsilon", "cap_delta", "spent", "revoked_at")
    list_filter = ("dataset",)
    readonly_fields = ("state", "created_by", "created_at")

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

    @admin.display(description="epsilon spent by analyst")
    def spent(self, g):
        ds = g.dataset
        limit = Limit.of_grant(g, ds) or Limit.of_dataset(ds)
        return _spent(g.state, limit)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    list_display = ("id", "dataset", "analyst", "status", "reference", "created_at", "committed_at")
    list_filter = ("status", "dataset")
    search_fields = ("reference",)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
