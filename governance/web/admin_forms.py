"""Admin forms: registering a table and editing a dataset go through ``governance.datasets.registry``."""

import re

from django import forms
from django.core.exceptions import ValidationError
from django.contrib.auth.forms import UserChangeForm

from accounting import POLICIES
from accounting.events import MAX_EPSILON

from ..core import json_text
from ..core.errors import InvalidDataset
from ..datasets import budget, registry
from ..datasets.data import table_schema
from ..datasets.schema import validate_schema
from ..core.roles import AUDITORS_GROUP
from ..models import AuditRecord, Grant, LedgerEntry


def _raise(e: InvalidDataset):
    errors = e.extra.get("errors")
    if errors:
        raise forms.ValidationError([f"{col}: {msg}" for col, msg in errors.items()])
    raise forms.ValidationError(e.detail)


class PlainFloatField(forms.FloatField):
    """A number typed as a plain decimal in ASCII digits (float() also reads "1_000" and
    full-width digits, which would store another number than the officer saw)."""

    def to_python(self, value):
        if isinstance(value, str) and value.strip() and not budget.is_plain_number(value):
            raise forms.ValidationError("Enter a plain decimal number (ASCII digits, as 0.5 or 1e-6).",
                                        code="invalid")
        return super().to_python(value)


class PlainIntegerField(forms.IntegerField):
    """A whole number typed in ASCII digits (int() also reads "1_0" and full-width digits)."""

    def to_python(self, value):
        if isinstance(value, str) and value.strip() and not re.fullmatch(r"[+-]?[0-9]+", value.strip()):
            raise forms.ValidationError("Enter a whole number in ASCII digits.", code="invalid")
        return super().to_python(value)


class DatasetRegisterForm(forms.Form):
    name = forms.SlugField(max_length=100, help_text="lowercase identifier used in the API")
    title = forms.CharField(max_length=200, required=False)
    upload = forms.FileField(required=False, label="Table file (CSV or Parquet)")
    path = forms.CharField(required=False, max_length=1000, label="…or a path on the server",
                           help_text="inside DATASET_IMPORT_DIRS")
    unit_column = forms.CharField(required=False, max_length=200, label="Privacy-unit column",
                                  help_text="e.g. patient_id; blank = one row per person")
    budget_epsilon = PlainFloatField(min_value=1e-9, max_value=MAX_EPSILON, initial=1.0)
    budget_delta = forms.CharField(initial="auto", help_text='a number below 1/n and 0.1, or "auto" = 1/n^1.2 (at most 0.001)')
    policy = forms.ChoiceField(choices=[(p, p) for p in POLICIES], initial="rdp")
    schema = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "cols": 80}), required=False,
                             help_text='optional JSON overrides, e.g. {"age": {"lower": 18, "upper": 90}}')

    def clean_schema(self):
        raw = self.cleaned_data.get("schema", "").strip()
        if not raw:
            return None
        try:
            return json_text.loads(raw)
        except ValueError as e:
            raise forms.ValidationError(str(e)) from None

    def register(self, user):
        d = self.cleaned_data
        try:
            return registry.register(
                name=d["name"], created_by=user, upload=d.get("upload") or None, path=d.get("path") or None,
                title=d.get("title", ""), unit_column=d.get("unit_column", ""), schema=d.get("schema"),
                budget_epsilon=d["budget_epsilon"], budget_delta=d["budget_delta"], policy=d["policy"])
        except InvalidDataset as e:
            self.add_error(None, e.detail)
            for col, msg in (e.extra.get("errors") or {}).items():
                self.add_error(None, f"{col}: {msg}")
            return None


class SafeJSONFormField(forms.JSONField):
    """A JSON form field read with the API's limits (``core.json_text``): deep nesting or a
    5,000-digit number is a form error, not a 500."""

    def to_python(self, value):
        if isinstance(value, str) and value.strip():
            try:
                json_text.loads(value)
            except ValueError as e:
                raise forms.ValidationError(str(e)) from None
        return super().to_python(value)

    def bound_data(self, data, initial):  # the form shown again with the text as typed
        if isinstance(data, str):
            try:
                json_text.loads(data)
            except ValueError:
                return forms.fields.InvalidJSONInput(data)
        return super().bound_data(data, initial)


def _track_edits(form: forms.BaseForm) -> None:
    """Each field sent back with the value the page showed (a hidden input), so
    ``form.changed_data`` is what this officer changed, not what differs from the row as it
    is now: saving a page opened before another officer's edit keeps that edit (the later
    save sent every field and put the budget and allow_non_private back as they were). A
    POST without the shown value (a script's) is compared with the row as it is now."""
    for name, field in form.fields.items():
        field.show_hidden_initial = not form.is_bound or f"initial-{form.add_prefix(name)}" in form.data


def _shown(bound) -> object:
    """The value the page showed for ``bound`` (its hidden initial input; without one, the
    row as it is now), as ``changed_data`` compares it."""
    field = bound.field
    if not field.show_hidden_initial:
        return bound.initial
    try:
        return field.to_python(bound.form._widget_data_value(field.hidden_widget(), bound.html_initial_name))
    except ValidationError:
        return None


def _columns(schema) -> dict:
    cols = schema.get("columns") if isinstance(schema, dict) else schema
    return {c["name"]: c for c in cols if isinstance(c, dict) and isinstance(c.get("name"), str)} \
        if isinstance(cols, list) else {}


def schema_edits(shown, sent):
    """Of ``sent`` (the schema text an officer saved), the column fields that differ from
    ``shown`` (what her page showed): ``registry.update`` merges them per field, so a save
    from a page opened before another officer's schema edit keeps that edit. The whole text
    went before, and a second officer's change of one bound put back a domain value the
    first had just removed (a probe's). A column whose type changed is sent whole (a new
    type starts from a clean spec); ``sent`` as it is when ``shown`` is unknown or not a
    list of columns."""
    before, after = _columns(shown), _columns(sent)
    if not before or not after:
        return sent
    out = []
    for name, col in after.items():
        was = before.get(name)
        if was is None or col.get("type") != was.get("type"):
            out.append(col)
        elif changed := {k: v for k, v in col.items() if k != "name" and was.get(k, object()) != v}:
            out.append({"name": name, **changed})
    return {"columns": out}


class DatasetChangeForm(forms.ModelForm):
    """Schema and budget edits are validated by ``registry.update`` when saved, with only
    the fields the officer changed on the page (``edited``)."""

    schema = SafeJSONFormField(widget=forms.Textarea(attrs={"rows": 20, "cols": 100}))
    budget_delta_text = forms.CharField(label="Budget delta", help_text='a number below 1/n and 0.1, or "auto"')

    class Meta:
        from ..models import Dataset

        model = Dataset
        fields = ["title", "description", "schema", "budget_epsilon", "allow_non_private", "release_quantum_ms",
                  "approx_delta_share", "pld_certification"]
        # the model's form fields read "1_5" as 15 and "２０" as 20 (a probe): plain numbers only
        field_classes = {"budget_epsilon": PlainFloatField, "approx_delta_share": PlainFloatField,
                         "release_quantum_ms": PlainIntegerField}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["approx_delta_share"].required = False  # blank keeps the dataset's share
        if self.instance.pk:
            self.fields["budget_delta_text"].initial = "auto" if self.instance.delta_auto else repr(
                self.instance.budget_delta)
        _track_edits(self)

    def edited(self) -> dict:
        """``registry.update``'s keywords for the fields this officer changed on the page; of
        the schema, the column fields she changed only (``schema_edits``)."""
        names = {"budget_delta_text": "budget_delta"}
        out = {names.get(f, f): self.cleaned_data[f] for f in self.changed_data if f in self.cleaned_data}
        if "schema" in out:
            out["schema"] = schema_edits(_shown(self["schema"]), out["schema"])
        return out

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        ds = self.instance
        if data.get("approx_delta_share") is None:
            data["approx_delta_share"] = ds.approx_delta_share
        try:
            budget.parse_budget(data.get("budget_epsilon"), data.get("budget_delta_text"), ds.n_units)
            validate_schema(data.get("schema"), table_schema(ds), ds.unit_column, base=ds.schema)
        except InvalidDataset as e:
            _raise(e)
        return data


class GrantForm(forms.ModelForm):
    """A grant's cap, with the API's bounds (GrantSerializer): epsilon in [1e-9,
    MAX_EPSILON], delta in [0, 0.999999], both finite, or empty for no cap."""

    cap_epsilon = PlainFloatField(required=False, min_value=1e-9, max_value=MAX_EPSILON,
                                   help_text="this analyst's share of the dataset's epsilon (empty: no cap)")
    cap_delta = PlainFloatField(required=False, min_value=0.0, max_value=0.999999,
                                 help_text="this analyst's share of the dataset's delta (empty: no cap)")

    class Meta:
        model = Grant
        fields = ["analyst", "dataset", "cap_epsilon", "cap_delta"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _track_edits(self)

    def clean(self):
        """A pair whose grant is revoked is given again (``grants.give``, from "add grant"):
        the form works on that grant, so only an active one of the pair is a duplicate."""
        data = super().clean()
        analyst, dataset = data.get("analyst"), data.get("dataset")
        if self.instance.pk is None and analyst is not None and dataset is not None:
            revoked = Grant.objects.filter(analyst=analyst, dataset=dataset, revoked_at__isnull=False).first()
            if revoked is not None:
                self.instance = revoked
        return data


class AccountChangeForm(UserChangeForm):
    """An account's roles: an auditor holds no grant (docs/concepts.md), so an account
    with active grants is not made an auditor. Added to the group, an analyst kept her
    grants: she ran requests and read every analyst's in the audit trail. An account
    charged without a grant (an officer's external charges) stays an officer: ``audit
    verify`` accepts such a charge only from an officer, and a probe's un-ticked staff
    status made every later verification fail; it is deactivated instead."""

    def clean(self):
        data = super().clean()
        if (self.instance.pk and self.instance.is_staff and data.get("is_staff") is False
                and LedgerEntry.objects.filter(analyst=self.instance, grant__isnull=True).exists()):
            raise forms.ValidationError("This account was charged without a grant (external charges it recorded, "
                                        "or requests it ran as an officer): it stays staff, and the audit "
                                        "trail's verification needs it so. Deactivate it instead.")
        groups = data.get("groups")
        if (self.instance.pk and groups is not None and any(g.name == AUDITORS_GROUP for g in groups)
                and Grant.objects.filter(analyst=self.instance, revoked_at__isnull=True).exists()):
            raise forms.ValidationError("This account holds active grants, and an auditor holds none: revoke them "
                                        "first.")
        return data


def named_in_the_trail(user) -> bool:
    """Whether an audit record names this account (records name their actor by username:
    deleted, the name could be given to a new account and the trail read as its doing)."""
    return AuditRecord.objects.filter(actor=user.get_username()).exists()
