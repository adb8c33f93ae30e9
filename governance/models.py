"""Datasets, budgets, grants and the ledger.

Writes to budgets, grants and ledger entries go through ``governance.ledger`` (the
action functions), never through ``save()`` from views: a ledger entry's event is never
edited once written, and its status only moves forward by compare-and-set.
"""

from __future__ import annotations

import json
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from accounting import POLICIES

from .stored_json import storable

RELEASE_QUANTUM_MAX_MS = 60_000  # a dataset's release clock: 0 (off) .. one minute


class StorableJSONField(models.JSONField):
    """A JSON field written as ``stored_json.storable`` makes it, so that what the
    database gives back is what was hashed: a bound of 1e23 went to PostgreSQL's jsonb as
    1e+23 and came back as the int 10**23, where the audit record had hashed the float's
    own value (int(1e23)); every later check of the dataset's schema digest failed (a
    probe). Its migrations see a plain JSONField: the column is the same."""

    def get_prep_value(self, value):
        return super().get_prep_value(storable(value))

    def deconstruct(self):
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


class Dataset(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "pending (a worker is reading the table)"
        FAILED = "failed", "failed (the table could not be registered: see registration)"
        DRAFT = "draft", "draft (schema under review; no requests)"
        ACTIVE = "active", "active"

    class Format(models.TextChoices):
        CSV = "csv", "CSV"
        PARQUET = "parquet", "Parquet"

    class Execution(models.TextChoices):
        LOCAL = "local", "local (a worker reads the whole table)"
        DISTRIBUTED = "distributed", "distributed (Parquet partitions, run on the Dask cluster)"
        FEDERATED = "federated", "federated (rows stay at the sites; runs go to the Flower SuperLink)"

    name = models.SlugField(max_length=100, unique=True, help_text="Stable identifier used in the API.")
    title = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    file = models.CharField(max_length=500, help_text="Path of the stored table, relative to DATA_DIR.")
    file_format = models.CharField(max_length=10, choices=Format.choices)
    sha256 = models.CharField(max_length=64)
    execution = models.CharField(max_length=12, choices=Execution.choices, default=Execution.LOCAL,
                                 help_text="local: the stored file, read by one worker; distributed: Parquet "
                                 "partitions at location, run on the Dask cluster (governance.partitions).")
    location = models.CharField(max_length=1000, blank=True, help_text="A distributed dataset's partitions: "
                                "a directory or object-store prefix (blank for a stored file).")
    partitions = models.JSONField(default=list, blank=True, help_text="A distributed dataset's manifest: "
                                  '[{"path" (relative to location), "rows", "bytes"}], checked before each run.')
    arrow_schema = models.TextField(blank=True, help_text="A distributed dataset's Arrow schema (IPC, base64).")
    schema = StorableJSONField(help_text='{"columns": [{"name", "type", "lower", "upper", "domain"}]}')
    unit_column = models.CharField(max_length=200, blank=True,
                                   help_text="Column naming the privacy unit (e.g. patient_id); blank = one row.")
    n_rows = models.BigIntegerField()
    n_units = models.BigIntegerField(help_text="Privacy units: distinct unit ids, or rows.")
    max_rows_per_unit = models.IntegerField(default=1)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DRAFT)
    registration = models.JSONField(default=dict, blank=True, help_text="A table read off the request thread "
                                    "(governance.datasets): while pending, what the officer asked for (schema, "
                                    "budget delta, activate); once failed, the error. Empty once registered.")
    budget_epsilon = models.FloatField()
    budget_delta = models.FloatField()
    delta_auto = models.BooleanField(default=False, help_text="delta = 1 / n_units^1.2")
    policy = models.CharField(max_length=10, choices=[(p, p) for p in POLICIES], default="rdp")
    allow_non_private = models.BooleanField(
        default=False, help_text="Admit non-private releases (e.g. the epsilon = inf baseline of a DP-SGD sweep). "
        "They are recorded in the ledger as non_private and counted apart; they do not draw on the epsilon "
        "budget, and the dataset's DP guarantee does not cover them.")
    pld_certification = models.BooleanField(
        "PLD certification of single runs", default=False,
        help_text="Let a single pre-planned run (a DP-SGD training or an MST synthesis with accountant pld) be "
        "calibrated and certified by the privacy loss distribution, which is tighter than RDP for one run but not a valid "
        "filter across adaptive requests: the gate still charges the run by its RDP curve.")
    approx_delta_share = models.FloatField(
        "delta share for (epsilon, delta) events", default=0.1,
        validators=[MinValueValidator(0.0), MaxValueValidator(0.9)],
        help_text="RDP policy: the fraction of the budget's delta set aside for approximate-DP releases "
        "(epsilon_delta events); the rest is split over the filter's orders. Larger admits more such releases "
        "and makes every other request slightly dearer. 0 refuses them. Default 0.1, at most 0.9.")
    release_quantum_ms = models.PositiveIntegerField(
        "release clock (ms)", null=True, blank=True, validators=[MaxValueValidator(RELEASE_QUANTUM_MAX_MS)],
        help_text="Release clock of runs on this dataset, in milliseconds: what an analyst sees of a run that "
        "reads the data (progress, outcome, finish time) changes only every this many ms, so timing does not "
        "reveal the noise drawn or the data. Blank = the server default (RELEASE_QUANTUM_MS, 1000 ms). "
        "0 turns the clock off (answers as soon as ready): an explicit choice for datasets whose timing "
        "risk you accept. At most 60000.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def columns(self) -> dict[str, dict]:
        return {c["name"]: c for c in self.schema.get("columns", [])}


class FederatedSite(models.Model):
    """A site registered for a federated dataset: its id and its public row count. The rows
    stay at the site. Its secret is never stored: it is derived from SECRET_KEY, the dataset
    and the site (``governance.datasets.federated.site_secret``) and handed to the site by an
    officer (``manage.py federated secret``, ``POST /api/datasets/{name}/sites/{site}/secret/``)."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="sites")
    site = models.CharField(max_length=100, help_text="The site's id, as its agent's --site names it.")
    n_rows = models.BigIntegerField(validators=[MinValueValidator(1)], help_text="Rows the site holds (public).")
    secret_issued_at = models.DateTimeField(null=True, blank=True,
                                            help_text="When an officer last had the site's secret handed out.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["dataset_id", "id"]
        constraints = [models.UniqueConstraint(fields=["dataset", "site"], name="one_site_id_per_dataset")]

    def __str__(self):
        return f"{self.site} of {self.dataset_id}"


class Budget(models.Model):
    """The row the gate locks: the running cost vector of every reserved and committed entry."""

    dataset = models.OneToOneField(Dataset, on_delete=models.CASCADE, primary_key=True, related_name="budget")
    state = models.JSONField(default=dict)
    active_entries = models.BigIntegerField(default=0)
    committed = models.JSONField(default=dict, help_text="Cost vector of the committed entries only (the audit "
                                 "trail's running totals).")
    audit_seq = models.BigIntegerField(default=0, help_text="Number of audit records in this dataset's chain.")
    audit_head = models.CharField(max_length=64, blank=True, help_text="Hash of the chain's last record.")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"budget of {self.dataset_id}"


class Grant(models.Model):
    """An analyst may query a dataset, optionally within a cap on their own share."""

    analyst = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="grants")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="grants")
    cap_epsilon = models.FloatField(null=True, blank=True)
    cap_delta = models.FloatField(null=True, blank=True)
    state = models.JSONField(default=dict)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["analyst", "dataset"], name="one_grant_per_analyst_dataset")]
        ordering = ["dataset_id", "analyst_id"]

    def __str__(self):
        return f"{self.analyst} on {self.dataset}"

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class LedgerEntry(models.Model):
    """One charge. ``event`` is written once; status moves reserved -> committed | released."""

    class Status(models.TextChoices):
        RESERVED = "reserved"
        COMMITTED = "committed"
        RELEASED = "released"

    IMMUTABLE = ("dataset_id", "analyst_id", "grant_id", "reference", "event", "cost", "charge", "created_at")

    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="ledger")
    analyst = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="ledger_entries")
    grant = models.ForeignKey(Grant, on_delete=models.PROTECT, null=True, blank=True, related_name="ledger")
    reference = models.CharField(max_length=200, blank=True, help_text="Request id or description of the release.")
    event = models.JSONField(help_text="The mechanism event reserved, as JSON.")
    cost = models.JSONField(help_text="Cost vector of the event (derived; see accounting.costs).")
    charge = models.JSONField(help_text="epsilon/delta of this event alone under each accountant.")
    committed_event = models.JSONField(null=True, blank=True, help_text="Event actually spent, if smaller.")
    non_private = models.BooleanField(default=False, help_text="The event includes a non-private release.")
    committed_cost = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RESERVED, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    committed_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "ledger entries"
        indexes = [models.Index(fields=["dataset", "status"]), models.Index(fields=["analyst", "dataset"])]

    def __str__(self):
        return f"#{self.pk} {self.dataset_id} {self.status}"

    def save(self, *args, **kwargs):
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValidationError("Ledger entries are never edited; use governance.ledger actions.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValidationError("Ledger entries are never deleted.")


class Request(models.Model):
    """An analyst's request to an engine. Status moves forward only:
    queued -> running -> succeeded | failed | cancelled (or queued -> cancelled)."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)
    # JSON that can be megabytes (a grouped query's result and plan, a synthesis report):
    # deferred where rows are listed; five 7 MB results made the officer's pages take 30-43 s
    LARGE = ("result", "plan", "officer_report")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    analyst = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="requests")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="requests")
    engine = models.CharField(max_length=100)
    kind = models.CharField(max_length=100)
    params = models.JSONField(default=dict)
    fingerprint = models.CharField(max_length=64, db_index=True,
                                   help_text="Hash of dataset version, engine, kind and parameters (for replays).")
    idempotency_key = models.CharField(
        max_length=200, blank=True, default="",
        help_text="The client's Idempotency-Key header: a retried POST with the same key gets this request back.")
    plan = models.JSONField(help_text="The engine's plan: event, columns, details.")
    ledger_entry = models.OneToOneField(LedgerEntry, on_delete=models.PROTECT, null=True, blank=True,
                                        related_name="request")
    replay_of = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="replays")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    progress = models.JSONField(default=dict)
    result = models.JSONField(null=True, blank=True)
    result_salt = models.CharField(
        max_length=32, blank=True, default="", db_default="", help_text="Random hex text hashed in front of the result for the audit record's "
        "result_sha256: the analyst can show the record is of what she got; no one reading the trail can test "
        "guesses of the numbers.")
    officer_report = models.JSONField(
        null=True, blank=True, help_text="Diagnostics computed on the private rows (e.g. a synthetic table's quality "
        "and privacy reports): privacy officers only, never the analyst.")
    error = models.JSONField(null=True, blank=True)
    data_read = models.BooleanField(default=False, help_text="The worker has started reading the data.")
    cancel_requested = models.BooleanField(default=False)
    worker = models.CharField(max_length=200, blank=True)
    worker_process = models.CharField(
        max_length=64, blank=True, default="", db_default="", help_text="The worker process running it, as its "
        "liveness record names it (process id @ start time): a worker started again under the same node name (and in "
        "a container, the same process id) does not vouch for the run of the one that died.")
    run_task = models.CharField(max_length=64, blank=True, default="", db_default="",
                                help_text="The Celery task whose turn runs it (a worker's hard time limit finds "
                                "the run it ended by this).")
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="Last sign of life of the worker running it "
                                        "(governance.recovery sweeps requests whose worker went silent).")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        # (analyst, started_at): an analyst's last start, which decides whose turn it is (requests.turns)
        # (created_at), (dataset, created_at): the lists' order (an officer's, a dataset's last
        # requests) read off an index, not sorted whole: 40,000 requests took 2.3 s a page (a probe)
        indexes = [models.Index(fields=["analyst", "fingerprint", "status"]),
                   models.Index(fields=["analyst", "started_at"], name="request_analyst_started"),
                   models.Index(fields=["-created_at"], name="request_created"),
                   models.Index(fields=["dataset", "-created_at"], name="request_dataset_created")]
        constraints = [models.UniqueConstraint(fields=["analyst", "idempotency_key"],
                                               condition=~models.Q(idempotency_key=""),
                                               name="request_idempotency_key_per_analyst")]

    def __str__(self):
        return f"{self.engine}.{self.kind} on {self.dataset_id} ({self.status})"


#: what an audit record's JSON column that cannot be parsed is read as (``RecordJSONDecoder``)
UNREADABLE = "unreadable JSON: edited in the database (a number of over 4,300 digits, nesting past the parser's depth)"


class RecordJSONDecoder(json.JSONDecoder):
    """The audit records' JSON columns as read from the database. The service never writes
    what Python cannot parse, so such a column was edited in the database: one record set to
    ``{"x": 4301 nines}`` or an array 1,000 deep ended ``audit verify``, every export and the
    audit list in a traceback, naming no record (probe CR). Read as ``{"unreadable": ...}``,
    the record fails its hash and verify names it."""

    def decode(self, s, *args, **kwargs):
        try:
            return super().decode(s, *args, **kwargs)
        except (ValueError, RecursionError):
            return {"unreadable": UNREADABLE}


class AuditRecord(models.Model):
    """One link of a dataset's hash chain: a release, a refund, a refusal, a replay, a site's
    secret handed out, an officer's change of the budget or a privacy setting, or of a grant.

    Written by ``governance.ledger.trail.append`` in the transaction (and under the budget row
    lock) of the ledger action it records; never edited or deleted. ``hash`` is the
    SHA-256 of the record's canonical JSON (``governance.ledger.trail.body``), which includes
    ``prev_hash``, the hash of the record before it (64 zeros for the first).
    """

    class Action(models.TextChoices):
        COMMIT = "commit", "commit (a release, charged)"
        RELEASE = "release", "release (reservation refunded)"
        REFUSE = "refuse", "refuse (the gate said no)"
        REPLAY = "replay", "replay (a stored release served again, no charge)"
        SITE_KEY = "site_key", "site key (a federated site's secret handed out, no charge)"
        SETTINGS = "settings", "settings (an officer changed the budget or a privacy setting, no charge)"
        GRANT = "grant", "grant (an officer gave, re-capped or revoked an analyst's grant, no charge)"

    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="audit_records")
    seq = models.BigIntegerField(help_text="Position in the dataset's chain, from 1.")
    action = models.CharField(max_length=10, choices=Action.choices)
    at = models.DateTimeField()
    actor = models.CharField(max_length=150, help_text="Username of the analyst (or officer) it was for.")
    request_id = models.UUIDField(null=True, blank=True)
    ledger_entry_id = models.BigIntegerField(null=True, blank=True)
    reference = models.CharField(max_length=200, blank=True)
    engine = models.CharField(max_length=100, blank=True)
    kind = models.CharField(max_length=100, blank=True)
    params = models.JSONField(decoder=RecordJSONDecoder, null=True, blank=True)
    outcome = models.CharField(max_length=20, help_text="succeeded, failed, cancelled, charged, refused, replayed")
    reason = models.CharField(max_length=100, blank=True, help_text="Error code of a refusal or failure.")
    detail = models.TextField(blank=True)
    event = models.JSONField(
        decoder=RecordJSONDecoder, null=True, blank=True,
        help_text="The event spent (commit), refunded (release) or refused (refuse).")
    reserved_event = models.JSONField(
        decoder=RecordJSONDecoder, null=True, blank=True, help_text="The event reserved, if more than spent.")
    charge = models.JSONField(
        decoder=RecordJSONDecoder, null=True, blank=True, help_text="epsilon/delta of this record alone per accountant.")
    totals = models.JSONField(
        decoder=RecordJSONDecoder, help_text="Committed epsilon/delta of the dataset after this record, per accountant.")
    non_private = models.BooleanField(default=False)
    result_sha256 = models.CharField(max_length=64, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    cluster = models.JSONField(
        decoder=RecordJSONDecoder, null=True, blank=True,
        help_text="The cluster job of a distributed run: backend, scheduler address (no credentials), job and task "
                  "keys; of a federated run: backend flower, the SuperLink, the Flower run and the sites connected and "
                  "refused (hashed only when set).")
    requested_at = models.DateTimeField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["dataset_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["dataset", "seq"], name="one_audit_record_per_seq")]
        indexes = [models.Index(fields=["dataset", "action", "seq"]), models.Index(fields=["actor", "dataset"])]

    def __str__(self):
        return f"{self.dataset_id}#{self.seq} {self.action}"

    def save(self, *args, **kwargs):
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValidationError("Audit records are never edited.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValidationError("Audit records are never deleted.")
