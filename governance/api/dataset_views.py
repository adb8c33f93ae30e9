"""Datasets: register, upload, activate, estimate, recommendation, charges, preview (dummy rows),
a federated dataset's site secrets (officers).
"""

import re

from django.conf import settings
from django.db.models import Count, OuterRef, Subquery
from django.http import Http404
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    inline_serializer,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from ..core.errors import InvalidRequest
from ..core.roles import is_officer
from ..datasets import federated, registry as ds_actions
from ..datasets import preview as dummy_data
from ..datasets.preview import DEFAULT_PREVIEW_ROWS, MAX_PREVIEW_ROWS
from ..datasets.recommendations import RANGES, recommend
from ..ledger import actions as ledger, estimates
from ..models import Dataset, LedgerEntry
from ..requests.sql import from_sql, price
from . import serializers as s
from .common import FormatSuffix, visible_datasets
from .parsers import FormParser, JSONParser, MultiPartParser
from .permissions import IsOfficer, OfficerWritesOnly


class DatasetViewSet(FormatSuffix, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Datasets: tables registered with a schema, a privacy unit and a budget."""

    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9][a-z0-9_-]*"
    permission_classes = [IsAuthenticated, OfficerWritesOnly]
    parser_classes = [JSONParser, MultiPartParser, FormParser]
    filterset_fields = ["status", "policy"]
    ordering_fields = ["name", "created_at", "n_units"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return Dataset.objects.none()
        # each row's non-private releases in one subquery (a list of 1,000 ran 1,000 counts)
        live = LedgerEntry.objects.filter(dataset=OuterRef("pk"), non_private=True).exclude(
            status=LedgerEntry.Status.RELEASED).order_by().values("dataset").annotate(n=Count("pk")).values("n")
        return visible_datasets(self.request.user).annotate(non_private_n=Subquery(live))

    def filter_queryset(self, queryset):
        # The dataset filters (?status=, ?policy=) are for the list only: on a detail route
        # get_object() would apply them too, and ?status=reserved on .../ledger/ means the
        # ledger's status, not the dataset's.
        if self.action != "list":
            return queryset
        return super().filter_queryset(queryset)

    def get_serializer_class(self):
        if getattr(self, "swagger_fake_view", False):  # the schema is the same whoever asks for it
            return s.DatasetSerializer  # (an officer's answers: OfficerDataset, api/openapi.py)
        return s.OfficerDatasetSerializer if is_officer(self.request.user) else s.DatasetSerializer

    @extend_schema(request=s.DatasetCreateSerializer, responses={201: s.OfficerDatasetSerializer,
                                                                 202: s.OfficerDatasetSerializer})
    def create(self, request):
        """Register a table: upload it (multipart ``file``) or name a server ``path``. 201
        with the dataset; 202 with the dataset ``pending`` when the table is larger than
        ``REGISTER_INLINE_BYTES``: a worker reads it, and the dataset becomes ``draft`` (or
        ``active``) or ``failed`` (``registration.error`` says why)."""
        data = s.DatasetCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        schema = v.get("schema")
        ds = ds_actions.register(
            name=v["name"], created_by=request.user, upload=v.get("file"), path=v.get("path"),
            file_format=v.get("format"), title=v.get("title", ""), description=v.get("description", ""),
            unit_column=v.get("unit_column", ""), schema=schema, budget_epsilon=v["budget_epsilon"],
            budget_delta=v.get("budget_delta", "auto"), policy=v["policy"], activate=v["activate"],
            execution=v["execution"], sites=v.get("sites"))
        pending = ds.status == Dataset.Status.PENDING  # a large table: read by a worker (governance/datasets/registry.py)
        return Response(s.OfficerDatasetSerializer(ds, context={"request": request}).data,
                        status=status.HTTP_202_ACCEPTED if pending else status.HTTP_201_CREATED)

    @extend_schema(request=s.DatasetUpdateSerializer, responses=s.OfficerDatasetSerializer)
    def partial_update(self, request, name=None):
        """Edit the schema (bounds, domains, types), the budget, the policy or the texts. A
        change of the budget or of a privacy setting (policy, delta share, non-private
        releases, release clock, PLD) is a ``settings`` record in the dataset's audit chain."""
        ds = self.get_object()
        data = s.DatasetUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        ds = ds_actions.update(ds, actor=request.user.get_username(), **data.validated_data)
        return Response(s.OfficerDatasetSerializer(ds, context={"request": request}).data)

    @extend_schema(request=None, responses=s.OfficerDatasetSerializer)
    @action(detail=True, methods=["post"])
    def activate(self, request, name=None):
        """Confirm the reviewed schema and open the dataset to requests."""
        ds = self.get_object()
        ds_actions.not_registered(ds)
        Dataset.objects.filter(pk=ds.pk, status__in=[Dataset.Status.DRAFT, Dataset.Status.ACTIVE]).update(
            status=Dataset.Status.ACTIVE)
        ds.refresh_from_db()
        return Response(s.OfficerDatasetSerializer(ds, context={"request": request}).data)

    @extend_schema(request=None, responses=s.OfficerDatasetSerializer)
    @action(detail=True, methods=["post"])
    def deactivate(self, request, name=None):
        """Take the dataset out of service: back to draft, where it takes no request and
        analysts do not see it; its queued requests are cancelled and refunded at once
        (``dataset.inactive``: ``activate`` does not bring them back); a running one
        finishes. Its ledger, grants and audit chain stay; ``activate`` reopens it."""
        ds = self.get_object()
        ds_actions.not_registered(ds)
        ds_actions.take_out_of_service(ds)
        ds.refresh_from_db()
        return Response(s.OfficerDatasetSerializer(ds, context={"request": request}).data)

    @extend_schema(request=None, responses={200: inline_serializer("SiteSecret", {
        "dataset": serializers.CharField(), "site": serializers.CharField(),
        "secret": serializers.CharField(help_text="the site agent's --key"),
        "agent": serializers.CharField(help_text="the site agent's command line, to fill in")})})
    @action(detail=True, methods=["post"], url_path=r"sites/(?P<site>[A-Za-z0-9][A-Za-z0-9_.-]{0,99})/secret",
            permission_classes=[IsAuthenticated, IsOfficer])
    def site_secret(self, request, name=None, site=None):
        """Hand a federated dataset's site its secret (privacy officers only): derived from
        SECRET_KEY, the dataset and the site, never stored; the time it was handed out is
        noted on the site and in the dataset's audit chain (a ``site_key`` record naming the
        officer and the site). Give it to the site's operator over a trusted channel."""
        ds = self.get_object()
        secret = federated.issue_secret(ds, site, request.user.get_username())
        return Response({"dataset": ds.name, "site": site, "secret": secret, "agent": (
            f"python -m engines.federated.site --superlink {settings.FEDERATED_SUPERLINK or 'HOST:PORT'} "
            f"--dataset {ds.name} --site {site} --key @{site}.secret --table ROWS.parquet "
            # without either, the agent retried a TLS handshake for ever on a plain SuperLink (a probe)
            "--root-certificates CA.pem (or --insecure for a SuperLink without TLS)")})

    @extend_schema(request=s.EstimateInputSerializer, responses={200: inline_serializer("Estimate", {
        "events": serializers.ListField(), "total": serializers.DictField(), "would_admit": serializers.BooleanField(),
        "has_grant": serializers.BooleanField(), "fits": serializers.IntegerField(allow_null=True),
        "budget": serializers.DictField(),
        "request": serializers.DictField(required=False, help_text="the planned request (engine, kind, params), "
                                                                   "given a request or sql")})})
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def estimate(self, request, name=None):
        """What an event (or list) would cost under each accountant, whether the gate would
        admit it now, and how many such requests still fit. Charges nothing. Given a request
        (``engine``, ``kind``, ``params``) or ``sql`` instead, the engine plans it first (no
        data read) and its event is priced: the event POST /api/requests/ would reserve."""
        data = s.EstimateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        try:
            ds = self.get_object()
        except Http404:
            if "sql" in v:  # the SQL's own errors first: its FROM may not name a dataset (a CTE's name)
                from_sql(v["sql"], v.get("params") or {})
            raise
        if "sql" in v or "kind" in v:
            return Response(price(ds, request.user, sql=v.get("sql"), engine=v.get("engine"), kind=v.get("kind"),
                                  params=v.get("params")))
        events = v.get("events", v.get("event"))
        return Response(estimates.estimate(ds, request.user, events))

    @extend_schema(parameters=[
        OpenApiParameter("rows", int, description=f"how many rows (1 to {MAX_PREVIEW_ROWS}, "
                                                  f"default {DEFAULT_PREVIEW_ROWS})"),
        OpenApiParameter("seed", int, description="the generator's seed (0 to 2^32 - 1, default 0)")],
        responses={200: inline_serializer("Preview", {
            "dataset": serializers.CharField(), "rows": serializers.IntegerField(),
            "seed": serializers.IntegerField(), "columns": serializers.ListField(),
            "data": serializers.ListField(), "generated": serializers.DictField()})})
    @action(detail=True, methods=["get"], permission_classes=[IsAuthenticated])
    def preview(self, request, name=None):
        """Dummy rows generated from the declared schema alone (types, bounds, domains): no
        stored row is read and no budget is spent. For trying queries and code; the values
        say nothing about the table."""
        ds = self.get_object()
        rows = _int_param(request, "rows", DEFAULT_PREVIEW_ROWS, 1, MAX_PREVIEW_ROWS)
        seed = _int_param(request, "seed", 0, 0, 2**32 - 1)
        columns = s.DatasetSerializer(ds, context={"request": request}).get_columns(ds)
        if rows > (most := dummy_data.max_rows(columns)):  # a wide table: keep the answer a few MB
            raise InvalidRequest(f"rows x columns must stay under {dummy_data.MAX_PREVIEW_CELLS:,} cells and about "
                                 f"{dummy_data.MAX_PREVIEW_BYTES >> 20} MB: at most {most:,} rows of this table",
                                 errors={"rows": "too many for this table's width"})
        out = dummy_data.dummy_rows(columns, ds.unit_column or None, rows, seed)
        return Response({"dataset": ds.name, "rows": rows, "seed": seed, **out})

    @extend_schema(request=s.ChargeInputSerializer, responses={201: s.LedgerEntrySerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated, IsOfficer])
    def charges(self, request, name=None):
        """Record a release made outside the service: through the gate (409 if it does not
        fit) and committed at once; named to an analyst, hers and under her grant too (403
        when she has none here). Privacy officers only."""
        ds = self.get_object()
        data = s.ChargeInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        analyst = data.validated_data.get("analyst")
        entry = ledger.charge(ds, analyst or request.user, data.validated_data["event"],
                              reference=data.validated_data["reference"], recorded_by=request.user if analyst else None)
        return Response(s.LedgerEntrySerializer(entry).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[OpenApiParameter("sensitivity", enum=list(RANGES), default="medium")],
                   responses={200: inline_serializer("Recommendation", {
                       "sensitivity": serializers.CharField(), "meaning": serializers.CharField(),
                       "epsilon_range": serializers.ListField(child=serializers.FloatField()),
                       "privacy_units": serializers.IntegerField(),
                       "delta_recommended": serializers.FloatField(), "delta_max": serializers.FloatField(),
                       "warnings": serializers.ListField(child=serializers.CharField()),
                       "sources": serializers.ListField(child=serializers.CharField())})})
    @action(detail=True, methods=["get"], permission_classes=[IsAuthenticated])
    def recommendation(self, request, name=None):
        """Published guidance as numbers for this dataset: epsilon range, delta for its size."""
        ds = self.get_object()
        sensitivity = request.query_params.get("sensitivity", "medium")
        if sensitivity not in RANGES:
            raise InvalidRequest(f"sensitivity must be one of {', '.join(RANGES)}, got {sensitivity!r}")
        return Response(recommend(ds.n_units, sensitivity))

    @extend_schema(responses=s.LedgerEntrySerializer(many=True),
                   parameters=[OpenApiParameter("status", enum=list(LedgerEntry.Status.values))])
    # no filter backends: the list's filters (policy, ordering) did nothing here, yet the
    # OpenAPI schema listed them
    @action(detail=True, methods=["get"], permission_classes=[IsAuthenticated], filter_backends=[])
    def ledger(self, request, name=None):
        """This dataset's ledger entries (analysts: their own only)."""
        ds = self.get_object()
        qs = LedgerEntry.objects.filter(dataset=ds).select_related("dataset", "analyst")
        if not is_officer(request.user):
            qs = qs.filter(analyst=request.user)
        st = request.query_params.get("status")
        if st:
            if st not in LedgerEntry.Status.values:
                raise InvalidRequest(f"status must be one of {', '.join(LedgerEntry.Status.values)}")
            qs = qs.filter(status=st)
        page = self.paginate_queryset(qs.order_by("id"))
        return self.get_paginated_response(s.LedgerEntrySerializer(page, many=True).data)


def _int_param(request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    # ASCII digits only: int() also reads "1_0" (10) and other scripts' digits
    value = int(raw) if re.fullmatch(r"\s*[+-]?[0-9]{1,18}\s*", raw, re.ASCII) else None
    if value is None or not lo <= value <= hi:
        raise InvalidRequest(f"{name} must be an integer from {lo} to {hi}, got {raw[:50]!r}",
                             errors={name: f"an integer from {lo} to {hi}"})
    return value
