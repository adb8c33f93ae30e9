"""The audit API: records, the chain's verification and exports. Privacy officers and
auditors only; auditors see nothing else (no datasets' rows, no results, no requests)."""

import datetime
from types import SimpleNamespace

from django.core.exceptions import ValidationError
from django_filters import rest_framework as filters
from django_filters.fields import IsoDateTimeField
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response

from ..audit import export as audit_export, verification
from ..core import roles
from ..core.errors import InvalidRequest
from ..datasets.registry import NAME_RE
from ..models import AuditRecord
from .common import FormatSuffix


class CanAudit(BasePermission):
    message = "Only privacy officers and auditors may read the audit trail."

    def has_permission(self, request, view):
        return roles.can_audit(request.user)


class AuditRecordSerializer(serializers.ModelSerializer):
    dataset = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = AuditRecord
        fields = ["id", "dataset", "seq", "action", "at", "actor", "request_id", "ledger_entry_id", "reference",
                  "engine", "kind", "params", "outcome", "reason", "detail", "event", "reserved_event", "charge",
                  "totals", "non_private", "result_sha256", "worker", "cluster", "requested_at", "prev_hash", "hash"]
        read_only_fields = fields


FORMATS = audit_export.EXPORT_FORMATS


class UtcDateTimeField(IsoDateTimeField):
    """An ISO 8601 date and time that is one in UTC too: ``9999-12-31T23:59:59-01:00`` is
    past year 9999 in UTC, which SQLite's adapter cannot write (an OverflowError, a 500)."""

    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is not None and parsed.tzinfo is not None:
            try:
                parsed.astimezone(datetime.timezone.utc)
            except OverflowError:
                raise ValidationError("the date and time is outside years 1-9999 in UTC", code="invalid") from None
        return parsed


class UtcDateTimeFilter(filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField


class AuditFilter(filters.FilterSet):
    at__gte = UtcDateTimeFilter(field_name="at", lookup_expr="gte")
    at__lte = UtcDateTimeFilter(field_name="at", lookup_expr="lte")

    class Meta:
        model = AuditRecord
        fields = {"dataset__name": ["exact"], "action": ["exact"], "actor": ["exact"], "outcome": ["exact"]}


class ExportNegotiation(DefaultContentNegotiation):
    """``?format=`` names the export's format here, not DRF's renderer."""

    settings = SimpleNamespace(URL_FORMAT_OVERRIDE=None)


class AuditViewSet(FormatSuffix, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Audit records: one per release, refund, refusal and replay, hash-chained per dataset.
    Filter with ``?dataset__name=``, ``?action=``, ``?actor=``, ``?outcome=``."""

    serializer_class = AuditRecordSerializer
    permission_classes = [IsAuthenticated, CanAudit]
    content_negotiation_class = ExportNegotiation
    filterset_class = AuditFilter
    ordering_fields = ["seq", "at", "id"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return AuditRecord.objects.none()
        return AuditRecord.objects.select_related("dataset").order_by("dataset__name", "seq")

    @extend_schema(parameters=[OpenApiParameter("dataset", str, description="a dataset name (repeatable); default all")],
                   responses={200: inline_serializer("AuditVerification", {
                       "ok": serializers.BooleanField(), "datasets": serializers.IntegerField(),
                       "records": serializers.IntegerField(), "heads": serializers.DictField(),
                       "first_broken": serializers.DictField(allow_null=True),
                       "problems": serializers.ListField(child=serializers.CharField()),
                       "legacy_records": serializers.ListField(child=serializers.DictField())})})
    @action(detail=False, methods=["get"])
    def verify(self, request):
        """Re-hash the chains and check them against the ledger (``manage.py audit verify``)."""
        return Response(verification.verify(_datasets(request), stop_at_first=False).as_dict())

    @extend_schema(
        parameters=[OpenApiParameter("dataset", str, required=True,
                                     description="a dataset name (repeatable), or all"),
                    OpenApiParameter("format", str, enum=list(FORMATS), default="json")],
        responses={(200, "application/json"): OpenApiResponse(OpenApiTypes.OBJECT, description="JSON export"),
                   (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="CSV, one row per record"),
                   (200, "application/pdf"): OpenApiResponse(OpenApiTypes.BINARY, description="PDF report")})
    @action(detail=False, methods=["get"])
    def export(self, request):
        """The audit export of a dataset: JSON (re-verifiable with tools/recompose_audit.py),
        CSV or a PDF report with the burn-down chart (``manage.py audit export``)."""
        fmt = request.query_params.get("format", "json")
        if fmt not in FORMATS:
            raise InvalidRequest(f"format must be one of {', '.join(FORMATS)}", errors={"format": fmt[:50]})
        if not request.query_params.getlist("dataset"):
            raise InvalidRequest("name a dataset (?dataset=NAME, repeatable, or ?dataset=all)",
                                 errors={"dataset": "required"})
        return audit_export.http_response(_datasets(request), request.user, fmt)


def _datasets(request) -> list:
    names = request.query_params.getlist("dataset")
    # Only names a dataset can have reach the database: PostgreSQL refuses a NUL in a query (a 500).
    odd = [n for n in names if n != "all" and not NAME_RE.fullmatch(n)]
    if odd:
        raise InvalidRequest(f"no dataset named {', '.join(repr(n[:100]) for n in odd[:5])}",
                             errors={"dataset": "not found"})
    try:
        return audit_export.datasets_named(names)
    except LookupError as e:
        raise InvalidRequest(str(e), errors={"dataset": "not found"}) from e
