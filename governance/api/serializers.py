import math

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounting import POLICIES
from accounting.events import MAX_EPSILON
from accounting.costs import Cost

from ..core.dispatch import shown_progress
from ..core.roles import USERNAME_PATTERN, USERNAME_RULE, USERNAME_TAKEN, username_taken
from ..datasets.budget import is_plain_number
from ..datasets.federated import site_rows
from ..ledger.limits import Limit, budget_report, charge_summary
from ..ledger.refined_reports import active_event, dataset_report, entry_charge
from ..models import Dataset, Grant, LedgerEntry, Request

User = get_user_model()
FROM_DATA_FLAGS = ("domain_from_data", "integer_from_data")  # the officer's review notes, not the analyst's


class FiniteFloatField(serializers.FloatField):
    """A float that refuses NaN and infinity with a clear message, and a boolean (DRF's
    FloatField takes ``true`` as 1.0: a budget of ``true`` was a budget of 1)."""

    def to_internal_value(self, data):
        if isinstance(data, bool):
            raise serializers.ValidationError("Must be a number, not true or false.")
        if isinstance(data, str) and not is_plain_number(data):
            raise serializers.ValidationError("Must be a plain decimal number (ASCII digits, as 0.5 or 1e-6).")
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            raise serializers.ValidationError("Must be a finite number.")
        return value


@extend_schema_field({"oneOf": [{"type": "number", "minimum": 0},
                             {"type": "string", "description": 'a number as text (a form field), or "auto"'}]})
class DeltaField(serializers.CharField):
    """A budget's delta: a number (JSON, or its text in a form) or "auto"; read by
    ``datasets.budget.parse_budget`` (the schema says a number or "auto", not any string)."""

    takes_numbers = True  # (StrictInput refuses a number for any other text field)


class ProgressField(serializers.JSONField):
    """A request's progress (phase, fraction, the engine's figures), as its analyst sees it
    (``core.dispatch.shown_progress``)."""

    def to_representation(self, value):
        return super().to_representation(shown_progress(value))


class SafeJSONField(serializers.JSONField):
    """A JSON field whose value is safe to store, hash and render. A JSON body was checked
    by the parser (parsers.py); JSON text sent as a form field (multipart, urlencoded) is
    parsed here, so it gets the same limits: at most MAX_JSON_DEPTH deep, no NUL
    characters, no lone surrogates. A value from a JSON body is taken as parsed."""

    def to_internal_value(self, data):
        from rest_framework.utils import json

        from .parsers import finite_float, json_problem, no_duplicate_keys

        from_text = self.binary or getattr(data, "is_json_string", False)
        if not from_text:
            # already parsed from the JSON body (parsers.py): DRF's check would encode it
            # again (json.dumps of a million keys is seconds of a web worker's CPU)
            return data
        try:
            # as the JSON body parser reads: a duplicate key was taken here, its last value
            # charged (a probe), where the same text as a JSON body was a 400
            value = json.loads(data.decode() if isinstance(data, bytes) else data, parse_float=finite_float,
                               object_pairs_hook=no_duplicate_keys)
        except RecursionError:
            raise serializers.ValidationError("Value must be valid JSON: it is nested too deeply.") from None
        except (TypeError, ValueError) as e:
            raise serializers.ValidationError(f"Value must be valid JSON: {str(e)[:200]}.") from None
        if problem := json_problem(value):
            raise serializers.ValidationError(f"Value must be valid JSON: {problem}.")
        return value


class StrictInput:
    """An input serializer that refuses a field it does not take (400 naming it) instead of
    ignoring it: a misspelt or read-only field must not look accepted (``PATCH {"active":
    false}`` on a grant revokes nothing; DELETE does). A text field (or a name that looks
    a row up) given a JSON number is refused too: DRF reads its str() (``{"sql": 5}`` was
    refused as "not a SELECT statement: 5", a charge's ``reference: 1e15`` kept as
    "1000000000000000.0", ``username: 1e15`` made that user and a grant was given to it by
    that number: probes)."""

    NOT_FIELDS = {"csrfmiddlewaretoken"}  # the browsable API's HTML forms send it with the fields
    TEXT = (serializers.CharField, serializers.SlugRelatedField)  # (RegexField, EmailField: CharFields)

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            writable = {name for name, field in self.fields.items() if not field.read_only} | self.NOT_FIELDS
            unknown = sorted(str(k) for k in data.keys() if k not in writable)
            if unknown:
                raise serializers.ValidationError(
                    {k[:100]: "Unknown field: not taken here (read-only, or misspelt)." for k in unknown[:20]})
            numbers = {name: "Must be a string, not a number." for name, field in self.fields.items()
                       if isinstance(field, self.TEXT) and not getattr(field, "takes_numbers", False)
                       and not field.read_only and name in data
                       and isinstance(data[name], (int, float)) and not isinstance(data[name], bool)}
            if numbers:
                raise serializers.ValidationError(numbers)
        return super().to_internal_value(data)


@extend_schema_field({"type": "string", "enum": list(Dataset.Status.values)}, component_name="DatasetStatusEnum")
class DatasetStatusField(serializers.ChoiceField):
    """A dataset's status, named apart from the ledger entries' ``status`` in the OpenAPI schema."""

    def __init__(self, **kwargs):
        super().__init__(choices=Dataset.Status.choices, **kwargs)


class DatasetSerializer(serializers.ModelSerializer):
    status = DatasetStatusField(read_only=True)
    budget = serializers.SerializerMethodField(help_text="epsilon/delta of the budget and what is spent under each accountant")
    columns = serializers.SerializerMethodField()
    execution = serializers.ChoiceField(choices=Dataset.Execution.choices, read_only=True,
                                        help_text="local, distributed (Dask) or federated (rows at the sites: "
                                                  "engines with federated true only)")
    sites = serializers.SerializerMethodField(help_text="a federated dataset's sites and their row counts (public; "
                                                        "their secrets are never shown here)")

    class Meta:
        model = Dataset
        fields = ["id", "name", "title", "description", "status", "execution", "file_format", "unit_column",
                  "n_rows", "n_units", "sites", "policy", "allow_non_private", "budget_epsilon", "budget_delta",
                  "delta_auto", "approx_delta_share", "pld_certification", "columns", "budget", "created_at"]
        read_only_fields = fields

    @extend_schema_field({"type": "array", "items": {"type": "object", "properties": {
        "site": {"type": "string"}, "n_rows": {"type": "integer"}}}})
    def get_sites(self, ds) -> list:
        if ds.execution != Dataset.Execution.FEDERATED:
            return []
        return [dict(s) for s in site_rows(ds)]

    def get_columns(self, ds) -> list:
        request = self.context.get("request")
        officer = bool(request and request.user.is_staff)
        cols = ds.schema.get("columns", [])
        if officer:
            return cols
        # Analysts see the declared schema, not which parts of it were read from the data.
        return [{k: v for k, v in c.items() if k not in FROM_DATA_FLAGS} for c in cols]

    def get_budget(self, ds) -> dict:
        state = Cost.from_json(ds.budget.state)
        limit = Limit.of_dataset(ds)
        # one dataset: rdp also refined off the grid (reads its entries' events; not in lists)
        view = self.context.get("view")
        report = dataset_report(ds) if getattr(view, "action", None) == "retrieve" else budget_report(state, limit)
        if hasattr(ds, "non_private_n"):  # counted by the view's queryset (DatasetViewSet), null for none
            non_private = ds.non_private_n or 0
        else:
            non_private = ds.ledger.filter(non_private=True).exclude(status=LedgerEntry.Status.RELEASED).count()
        return {"epsilon": ds.budget_epsilon, "delta": ds.budget_delta, "policy": ds.policy,
                "active_entries": ds.budget.active_entries, "accountants": report,
                "non_private_releases": non_private}


class OfficerDatasetSerializer(DatasetSerializer):
    class Meta(DatasetSerializer.Meta):
        fields = DatasetSerializer.Meta.fields + ["max_rows_per_unit", "sha256", "created_by", "location",
                                                  "partitions", "registration"]
        read_only_fields = fields


class DatasetCreateSerializer(StrictInput, serializers.Serializer):
    name = serializers.RegexField(r"^[a-z0-9][a-z0-9_-]{0,99}$", help_text="lowercase slug, unique")
    title = serializers.CharField(required=False, allow_blank=True, max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    file = serializers.FileField(required=False, help_text="CSV or Parquet upload (multipart)")
    path = serializers.CharField(required=False, max_length=1000,
                                 help_text="A table on the server, inside DATASET_IMPORT_DIRS (with execution "
                                           "distributed: Parquet partitions, a directory, a file or a URI under "
                                           "DATASET_IMPORT_URIS, registered where they are)")
    execution = serializers.ChoiceField(choices=Dataset.Execution.values, default="local",
                                        help_text="local: the table is copied and one worker reads it; "
                                                  "distributed: runs go to the Dask cluster; federated: no table, "
                                                  "the rows stay at the sites (give schema and sites)")
    sites = SafeJSONField(required=False, help_text='federated only: [{"site": "h1", "n_rows": 1200}, ...], '
                                                    "distinct ids, positive row counts")
    format = serializers.ChoiceField(choices=["csv", "parquet"], required=False)
    unit_column = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    schema = SafeJSONField(required=False, help_text="Column specs overriding the inferred schema")
    budget_epsilon = FiniteFloatField(min_value=1e-9, max_value=MAX_EPSILON)
    budget_delta = DeltaField(required=False, default="auto", help_text='a number below 1/n and 0.1, or "auto"')
    policy = serializers.ChoiceField(choices=POLICIES, default="rdp")
    activate = serializers.BooleanField(default=False, help_text="Activate at once (skip the draft review)")

    def validate(self, attrs):
        if attrs.get("execution") == "federated":
            if "file" in attrs or "path" in attrs:
                raise serializers.ValidationError({"execution": "A federated dataset has no table here (its rows "
                                                   "stay at its sites): give schema and sites, no file or path."})
            missing = {k: "A federated dataset needs this." for k in ("schema", "sites") if k not in attrs}
            if missing:
                raise serializers.ValidationError(missing)
            return attrs
        if "sites" in attrs:
            raise serializers.ValidationError({"sites": "Only a federated dataset (execution federated) has sites."})
        if ("file" in attrs) == ("path" in attrs):
            raise serializers.ValidationError("Give exactly one of 'file' (upload) or 'path' (server file).")
        return attrs


class DatasetUpdateSerializer(StrictInput, serializers.Serializer):
    title = serializers.CharField(required=False, allow_blank=True, max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    schema = SafeJSONField(required=False)
    budget_epsilon = FiniteFloatField(required=False, min_value=1e-9, max_value=MAX_EPSILON)
    budget_delta = DeltaField(required=False, help_text='a number below 1/n and 0.1, or "auto"')
    policy = serializers.ChoiceField(choices=POLICIES, required=False)
    allow_non_private = serializers.BooleanField(
        required=False, help_text="admit non-private releases (sweep baselines at epsilon = inf); they are recorded "
                                  "and counted apart, outside the DP guarantee")
    pld_certification = serializers.BooleanField(
        required=False, help_text="let a single pre-planned run (a DP-SGD training, an MST synthesis) be calibrated "
                                  "and certified by PLD (params.accountant = pld); the gate still charges it by RDP")
    approx_delta_share = FiniteFloatField(
        required=False, min_value=0.0, max_value=0.9,
        help_text="RDP filter: fraction of the budget's delta set aside for (epsilon, delta) events (default 0.1); "
                  "fixed once the ledger has entries")


class GrantSerializer(StrictInput, serializers.ModelSerializer):
    analyst = serializers.SlugRelatedField(slug_field="username", queryset=User.objects.all())
    dataset = serializers.SlugRelatedField(slug_field="name", queryset=Dataset.objects.all())
    cap_epsilon = FiniteFloatField(required=False, allow_null=True, min_value=1e-9, max_value=MAX_EPSILON)
    cap_delta = FiniteFloatField(required=False, allow_null=True, min_value=0.0, max_value=0.999999)
    active = serializers.BooleanField(read_only=True)
    spent = serializers.SerializerMethodField(help_text="this analyst's share spent, under each accountant")

    class Meta:
        model = Grant
        fields = ["id", "analyst", "dataset", "cap_epsilon", "cap_delta", "active", "spent", "created_at", "revoked_at"]
        read_only_fields = ["id", "active", "spent", "created_at", "revoked_at"]
        # No unique-together validator: a revoked grant is re-activated by a new POST and a
        # duplicate active one is refused, both in GrantViewSet.perform_create.
        validators = []

    def get_spent(self, grant) -> dict:
        ds = grant.dataset
        limit = Limit.of_grant(grant, ds) or Limit("grant", ds.budget_epsilon, ds.budget_delta, ds.policy,
                                                             ds.approx_delta_share)
        # one grant: rdp also refined off the grid (reads the analyst's entries; not in lists)
        one = getattr(self.context.get("view"), "action", None) == "retrieve"
        return budget_report(Cost.from_json(grant.state), limit, active_event(ds, grant) if one else None)

    def validate_analyst(self, user):
        from ..core.roles import is_auditor

        if user.is_staff:
            raise serializers.ValidationError("Privacy officers need no grant.")
        if is_auditor(user):
            raise serializers.ValidationError("Auditors read the audit trail only; they cannot hold grants.")
        return user


class GrantUpdateSerializer(StrictInput, serializers.Serializer):
    cap_epsilon = FiniteFloatField(required=False, allow_null=True, min_value=1e-9, max_value=MAX_EPSILON)
    cap_delta = FiniteFloatField(required=False, allow_null=True, min_value=0.0, max_value=0.999999)


class LedgerEntrySerializer(serializers.ModelSerializer):
    dataset = serializers.SlugRelatedField(slug_field="name", read_only=True)
    analyst = serializers.SlugRelatedField(slug_field="username", read_only=True)
    charge = serializers.SerializerMethodField(
        help_text="epsilon/delta of this entry alone under each accountant at the dataset's delta (what it "
                  "committed, if less than reserved); rdp also refined_epsilon, its order off the grid")

    def get_charge(self, entry) -> dict:
        return entry_charge(entry, entry.dataset.budget_delta)

    class Meta:
        model = LedgerEntry
        fields = ["id", "dataset", "analyst", "reference", "status", "event", "committed_event", "charge",
                  "created_at", "committed_at", "released_at"]
        read_only_fields = fields


class ChargeInputSerializer(StrictInput, serializers.Serializer):
    event = SafeJSONField(help_text="The mechanism event of the release")
    reference = serializers.CharField(required=False, allow_blank=True, default="", max_length=200,
                                      help_text="What was released and where")
    analyst = serializers.CharField(
        required=False, max_length=150,
        help_text="The username of the analyst the release went to: the charge is hers, counted against her grant "
                  "on the dataset as well as the dataset's budget (a release a restored database lost is re-recorded "
                  "so). Without it the charge is the officer's own, under the dataset's budget only.")

    def validate_analyst(self, value):
        from ..core.roles import is_auditor, is_officer

        user = User.objects.filter(username=value, is_active=True).first()
        if user is None or is_officer(user) or is_auditor(user):
            raise serializers.ValidationError(f"no active analyst is named {value!r}")
        return user


class ComposeInputSerializer(StrictInput, serializers.Serializer):
    events = SafeJSONField(help_text="A list of events (or one event)")
    delta = FiniteFloatField(min_value=0.0, max_value=0.999999, help_text="Target total delta")


class AnalystSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = User
        fields = ["id", "username", "email", "role", "is_staff", "date_joined"]
        read_only_fields = ["id", "is_staff", "date_joined"]

    def get_role(self, user) -> str:
        from ..core.roles import is_auditor

        return "auditor" if is_auditor(user) else "analyst"


class AnalystCreateSerializer(StrictInput, serializers.Serializer):
    username = serializers.RegexField(USERNAME_PATTERN, error_messages={"invalid": USERNAME_RULE})  # core.roles
    email = serializers.EmailField(required=False, allow_blank=True)
    role = serializers.ChoiceField(["analyst", "auditor"], default="analyst",
                                   help_text="auditor: reads the audit trail and exports only")

    def validate_username(self, value):
        if username_taken(value):
            raise serializers.ValidationError(USERNAME_TAKEN)
        return value


class RequestCreateSerializer(StrictInput, serializers.Serializer):
    dataset = serializers.CharField(required=False, help_text="dataset name (with sql: optional, the FROM table)")
    engine = serializers.CharField(required=False, max_length=100,
                                   help_text="engine name (GET /api/engines/); with sql: aggregates")
    kind = serializers.CharField(required=False, max_length=100, help_text="a kind the engine serves (not with sql)")
    params = SafeJSONField(default=dict, help_text="the kind's parameters (see the engine's params_schema); "
                                                   "with sql only the privacy options (epsilon, rho, accuracy, "
                                                   "mechanism, max_rows_per_unit, candidates)")
    sql = serializers.CharField(required=False, max_length=10_000, trim_whitespace=False,
                                help_text="instead of engine and kind: one SELECT FROM a dataset (at most 10,000 "
                                          "characters) with up to 20 aggregates (COUNT(*), COUNT(column), "
                                          "COUNT(DISTINCT column), SUM, AVG, VARIANCE, MEDIAN, QUANTILE, "
                                          "PERCENTILE_CONT, MIN and MAX as DP percentiles), WHERE with AND / OR / NOT, "
                                          "BETWEEN, IN and IS [NOT] NULL, GROUP BY up to four keys (columns with a "
                                          "declared domain, FLOOR or CASE bins), HAVING, ORDER BY and LIMIT on the "
                                          "released values; planned into the aggregates request it equals "
                                          "(sql.unsupported names any other part)")

    def validate(self, attrs):
        if "sql" in attrs:
            if "kind" in attrs:
                raise serializers.ValidationError("With sql, give no kind: the query says it (engine: aggregates).")
            if attrs.get("engine", "aggregates") != "aggregates":
                raise serializers.ValidationError(f"sql is answered by the aggregates engine: give no engine "
                                                  f"(or engine: aggregates), not {str(attrs['engine'])[:50]!r}.")
            return attrs
        missing = {k: "This field is required (or give sql)." for k in ("dataset", "engine", "kind")
                   if k not in attrs}
        if missing:
            raise serializers.ValidationError(missing)
        return attrs


class EstimateInputSerializer(StrictInput, serializers.Serializer):
    event = SafeJSONField(required=False, help_text="One mechanism event (see the README for the format)")
    events = SafeJSONField(required=False, help_text="A list of events")
    engine = serializers.CharField(required=False, max_length=100, help_text="a request: engine name")
    kind = serializers.CharField(required=False, max_length=100, help_text="a request: the engine's kind")
    params = SafeJSONField(required=False, help_text="a request: its parameters (with sql: privacy options)")
    sql = serializers.CharField(required=False, max_length=10_000, trim_whitespace=False,
                                help_text="a request as SQL (as POST /api/requests/ takes it)")

    def validate(self, attrs):
        given = [k for k in ("event", "events", "kind", "sql") if k in attrs]
        if len(given) != 1:
            raise serializers.ValidationError(
                "Give exactly one of 'event', 'events', a request ('engine', 'kind', 'params') or 'sql'.")
        if "kind" in attrs and "engine" not in attrs:
            raise serializers.ValidationError({"engine": "A request needs its engine."})
        if ("engine" in attrs or "params" in attrs) and given[0] in ("event", "events"):
            raise serializers.ValidationError("'engine' and 'params' belong to a request, not to events.")
        if "sql" in attrs and (attrs.get("engine", "aggregates") != "aggregates"):
            raise serializers.ValidationError({"engine": "SQL is planned by the aggregates engine."})
        return attrs


class RequestSerializer(serializers.ModelSerializer):
    dataset = serializers.SlugRelatedField(slug_field="name", read_only=True)
    analyst = serializers.SlugRelatedField(slug_field="username", read_only=True)
    event = serializers.SerializerMethodField(help_text="the mechanism event reserved for this request")
    charge = serializers.SerializerMethodField(
        help_text="epsilon/delta charged under each accountant: reserved while queued or running, "
                  "what was committed when done, zero when refunded or replayed")
    result = serializers.SerializerMethodField()
    result_salt = serializers.SerializerMethodField()
    officer_report = serializers.SerializerMethodField()
    replayed = serializers.SerializerMethodField()
    progress = ProgressField(read_only=True)

    class Meta:
        model = Request
        fields = ["id", "dataset", "analyst", "engine", "kind", "params", "status", "progress", "event", "charge",
                  "result", "result_salt", "officer_report", "error", "replayed", "replay_of", "created_at",
                  "started_at", "finished_at"]
        read_only_fields = fields

    def get_event(self, req) -> dict:
        return req.plan.get("event")

    def get_charge(self, req) -> dict:
        return request_charge(req, self.context.get("request"))

    @extend_schema_field({"type": "object", "nullable": True,
                          "description": "the release, shown only to the analyst who asked"})
    def get_result(self, req):
        return request_result(req, self.context.get("request"))

    @extend_schema_field({"type": "string", "nullable": True,
                          "description": "the result's salt, shown only to the analyst who asked: the audit record's "
                                         "result_sha256 is SHA-256 of this text followed by the result's canonical "
                                         "JSON (sorted keys, no spaces)"})
    def get_result_salt(self, req):
        return request_result_salt(req, self.context.get("request"))

    @extend_schema_field({"type": "object", "nullable": True,
                          "description": "diagnostics computed on the private rows (a synthetic table's quality and "
                                         "privacy reports), shown to privacy officers only"})
    def get_officer_report(self, req):
        return request_officer_report(req, self.context.get("request"))

    def get_replayed(self, req) -> bool:
        return req.replay_of_id is not None


def request_charge(req, request) -> dict:
    entry = req.ledger_entry
    if entry is None or entry.status == LedgerEntry.Status.RELEASED:
        return {**charge_summary(Cost.zero(), req.dataset.budget_delta), "ledger_status": entry and entry.status}
    # rdp with refined_epsilon / refined_order: the order off the grid (governance/ledger/refined_reports.py);
    # not in the answer to the POST that admitted it (the admission path stays as fast as it was)
    refine = request is None or request.method == "GET"
    return {**entry_charge(entry, req.dataset.budget_delta, refine=refine), "ledger_status": entry.status}


def request_result(req, request):
    # Results go to the analyst who asked, and to no one else.
    if request is not None and request.user.pk == req.analyst_id:
        return req.result
    return None


def request_result_salt(req, request):
    if request is not None and request.user.pk == req.analyst_id and req.result is not None:
        return req.result_salt
    return None


def request_officer_report(req, request):
    if request is not None and request.user.is_staff:
        return req.officer_report
    return None


_DATETIME = serializers.DateTimeField()  # unbound: its to_representation reads only settings


def request_json(req: Request, request) -> dict:
    """``RequestSerializer(req, context={"request": request}).data``, written out: the
    serializer builds its 18 fields on every call (~1 ms of the request POST's and GET's
    CPU). RequestSerializer stays the OpenAPI schema and the list's renderer;
    tests/requests/test_request_json.py holds the two equal, field for field."""
    def dt(value):
        return None if value is None else _DATETIME.to_representation(value)

    return {
        "id": str(req.pk), "dataset": req.dataset.name, "analyst": req.analyst.username,
        "engine": req.engine, "kind": req.kind, "params": req.params, "status": str(req.status),
        "progress": shown_progress(req.progress), "event": req.plan.get("event"), "charge": request_charge(req, request),
        "result": request_result(req, request), "result_salt": request_result_salt(req, request),
        "officer_report": request_officer_report(req, request),
        "error": req.error, "replayed": req.replay_of_id is not None, "replay_of": req.replay_of_id,
        "created_at": dt(req.created_at), "started_at": dt(req.started_at), "finished_at": dt(req.finished_at),
    }
