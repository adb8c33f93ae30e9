"""API views. Permission rules (privacy officer = staff; analyst = any other user):

- datasets: officers see and change all; analysts see only active datasets they hold an
  active grant on; nobody gets rows through any endpoint;
- grants: officers manage; analysts list their own;
- ledger: officers see every entry; analysts only their own;
- estimate: anyone who can see the dataset; charges: officers only.
"""

import mimetypes
import re

from django.contrib.auth import get_user_model
from django.db import transaction
from django.http import FileResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.authtoken.models import Token
from rest_framework.decorators import action, api_view, permission_classes
from rest_framework.parsers import FormParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from .. import audit, ledger
from .. import datasets as ds_actions
from ..accounting import ACCOUNTANTS
from ..errors import InvalidRequest
from ..models import Dataset, Grant, LedgerEntry, Request
from ..recommendations import RANGES, recommend
from . import serializers as s
from .parsers import JSONParser, MultiPartParser
from .permissions import IsOfficer, OfficerWritesOnly, is_officer

User = get_user_model()


def visible_datasets(user):
    qs = Dataset.objects.select_related("budget")
    if is_officer(user):
        return qs
    return qs.filter(status=Dataset.Status.ACTIVE, grants__analyst=user, grants__revoked_at__isnull=True).distinct()


class FormatSuffix:
    """The router's format-suffix routes (``/api/datasets/x/estimate.json``) pass ``format``
    to the handler, and the actions here take no such argument (a TypeError: a 500 for any
    user). Keep the suffix for content negotiation only."""

    def dispatch(self, request, *args, **kwargs):
        self._format_suffix = kwargs.pop("format", None)
        return super().dispatch(request, *args, **kwargs)

    def get_format_suffix(self, **kwargs):
        return getattr(self, "_format_suffix", None)


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
        return visible_datasets(self.request.user)

    def filter_queryset(self, queryset):
        # The dataset filters (?status=, ?policy=) are for the list only: on a detail route
        # get_object() would apply them too, and ?status=reserved on .../ledger/ means the
        # ledger's status, not the dataset's.
        if self.action != "list":
            return queryset
        return super().filter_queryset(queryset)

    def get_serializer_class(self):
        return s.OfficerDatasetSerializer if is_officer(self.request.user) else s.DatasetSerializer

    @extend_schema(request=s.DatasetCreateSerializer, responses={201: s.OfficerDatasetSerializer})
    def create(self, request):
        """Register a table: upload it (multipart ``file``) or name a server ``path``."""
        data = s.DatasetCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        schema = v.get("schema")
        ds = ds_actions.register(
            name=v["name"], created_by=request.user, upload=v.get("file"), path=v.get("path"),
            file_format=v.get("format"), title=v.get("title", ""), description=v.get("description", ""),
            unit_column=v.get("unit_column", ""), schema=schema, budget_epsilon=v["budget_epsilon"],
            budget_delta=v.get("budget_delta", "auto"), policy=v["policy"], activate=v["activate"])
        return Response(s.OfficerDatasetSerializer(ds, context={"request": request}).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=s.DatasetUpdateSerializer, responses=s.OfficerDatasetSerializer)
    def partial_update(self, request, name=None):
        """Edit the schema (bounds, domains, types), the budget, the policy or the texts."""
        ds = self.get_object()
        data = s.DatasetUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        ds = ds_actions.update(ds, **data.validated_data)
        return Response(s.OfficerDatasetSerializer(ds, context={"request": request}).data)

    @extend_schema(request=None, responses=s.OfficerDatasetSerializer)
    @action(detail=True, methods=["post"])
    def activate(self, request, name=None):
        """Confirm the reviewed schema and open the dataset to requests."""
        ds = self.get_object()
        Dataset.objects.filter(pk=ds.pk).update(status=Dataset.Status.ACTIVE)
        ds.refresh_from_db()
        return Response(s.OfficerDatasetSerializer(ds, context={"request": request}).data)

    @extend_schema(request=s.EventsInputSerializer, responses={200: inline_serializer("Estimate", {
        "events": serializers.ListField(), "total": serializers.DictField(), "would_admit": serializers.BooleanField(),
        "has_grant": serializers.BooleanField(), "fits": serializers.IntegerField(allow_null=True),
        "budget": serializers.DictField()})})
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def estimate(self, request, name=None):
        """What an event (or list) would cost under each accountant, whether the gate would
        admit it now, and how many such requests still fit. Charges nothing."""
        ds = self.get_object()
        data = s.EventsInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        events = data.validated_data.get("events", data.validated_data.get("event"))
        return Response(ledger.estimate(ds, request.user, events))

    @extend_schema(request=s.ChargeInputSerializer, responses={201: s.LedgerEntrySerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated, IsOfficer])
    def charges(self, request, name=None):
        """Record a release made outside the service: through the gate (409 if it does not
        fit) and committed at once. Privacy officers only."""
        ds = self.get_object()
        data = s.ChargeInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        from ..submission import GATE_REFUSALS

        try:
            entry = ledger.charge(ds, request.user, data.validated_data["event"],
                                  reference=data.validated_data["reference"])
        except GATE_REFUSALS as e:
            audit.record_refusal(ds, request.user, data.validated_data["event"], e, audit.Context(
                kind="external charge", detail=data.validated_data["reference"]))
            raise
        return Response(s.LedgerEntrySerializer(entry).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[OpenApiParameter("sensitivity", enum=list(RANGES), default="medium")],
                   responses={200: inline_serializer("Recommendation", {
                       "sensitivity": serializers.CharField(), "epsilon_range": serializers.ListField(),
                       "delta_recommended": serializers.FloatField(), "delta_max": serializers.FloatField(),
                       "warnings": serializers.ListField()})})
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
    @action(detail=True, methods=["get"], permission_classes=[IsAuthenticated])
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


class GrantViewSet(FormatSuffix, viewsets.ModelViewSet):
    """Grants join an analyst to a dataset, optionally with a cap on their share.
    DELETE revokes (the grant and its history are kept for the ledger)."""

    serializer_class = s.GrantSerializer
    permission_classes = [IsAuthenticated, OfficerWritesOnly]
    filterset_fields = {"dataset__name": ["exact"], "analyst__username": ["exact"], "revoked_at": ["isnull"]}
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return Grant.objects.none()
        qs = Grant.objects.select_related("analyst", "dataset").order_by("id")
        if is_officer(self.request.user):
            return qs
        return qs.filter(analyst=self.request.user)

    def perform_create(self, serializer):
        analyst, dataset = serializer.validated_data["analyst"], serializer.validated_data["dataset"]
        existing = Grant.objects.filter(analyst=analyst, dataset=dataset).first()
        if existing is not None:
            if existing.active:
                raise InvalidRequest(f"{analyst} already holds a grant on {dataset}; PATCH it to change the cap.")
            Grant.objects.filter(pk=existing.pk).update(
                revoked_at=None, cap_epsilon=serializer.validated_data.get("cap_epsilon"),
                cap_delta=serializer.validated_data.get("cap_delta"))
            existing.refresh_from_db()
            serializer.instance = existing
            return
        serializer.save(created_by=self.request.user)

    @extend_schema(request=s.GrantUpdateSerializer)
    def partial_update(self, request, pk=None):
        grant = self.get_object()
        data = s.GrantUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            grant = Grant.objects.select_for_update().get(pk=grant.pk)
            for key, value in data.validated_data.items():
                setattr(grant, key, value)
            grant.save(update_fields=list(data.validated_data))
        return Response(self.get_serializer(grant).data)

    def update(self, request, *args, **kwargs):  # PUT is not offered
        raise InvalidRequest("Use PATCH to change a grant's cap.")

    def perform_destroy(self, grant):
        Grant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


class LedgerViewSet(viewsets.ReadOnlyModelViewSet):
    """Every ledger entry (analysts: their own). Filter by dataset, analyst, status."""

    serializer_class = s.LedgerEntrySerializer
    filterset_fields = {"dataset__name": ["exact"], "analyst__username": ["exact"], "status": ["exact"]}
    ordering_fields = ["id", "created_at"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return LedgerEntry.objects.none()
        qs = LedgerEntry.objects.select_related("dataset", "analyst").order_by("id")
        if is_officer(self.request.user):
            return qs
        return qs.filter(analyst=self.request.user)


class AnalystViewSet(FormatSuffix, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                     viewsets.GenericViewSet):
    """Analyst and auditor accounts and their API tokens (privacy officers only)."""

    serializer_class = s.AnalystSerializer
    permission_classes = [IsAuthenticated, IsOfficer]
    queryset = User.objects.filter(is_staff=False).order_by("id")  # officers' tokens are not managed here

    @extend_schema(request=s.AnalystCreateSerializer, responses={201: inline_serializer(
        "AnalystCreated", {"id": serializers.IntegerField(), "username": serializers.CharField(),
                           "role": serializers.CharField(), "token": serializers.CharField()})})
    def create(self, request):
        data = s.AnalystCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            user = User.objects.create_user(username=data.validated_data["username"],
                                            email=data.validated_data.get("email", ""))
            if data.validated_data["role"] == "auditor":
                from django.contrib.auth.models import Group

                user.groups.add(Group.objects.get_or_create(name=audit.AUDITORS_GROUP)[0])
            token = Token.objects.create(user=user)
        return Response({"id": user.pk, "username": user.username, "role": data.validated_data["role"],
                         "token": token.key}, status=201)

    @extend_schema(request=None, responses={200: inline_serializer("NewToken", {"token": serializers.CharField()}),
                                            204: None})
    @action(detail=True, methods=["post", "delete"])
    def token(self, request, pk=None):
        """POST: issue a new API token for the analyst (the old one stops working; tokens
        expire API_TOKEN_TTL_DAYS after issue). DELETE: revoke it, issuing none."""
        user = self.get_object()
        Token.objects.filter(user=user).delete()
        # ...and so do web sessions opened with it (/analyst/login/): a new (unusable)
        # password changes the session hash Django checks on every request.
        user.set_unusable_password()
        user.save(update_fields=["password"])
        if request.method == "DELETE":
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response({"token": Token.objects.create(user=user).key})


def role_of(user) -> str:
    if is_officer(user):
        return "privacy_officer"
    return "auditor" if audit.is_auditor(user) else "analyst"


@extend_schema(responses={200: inline_serializer("Me", {
    "username": serializers.CharField(), "role": serializers.CharField(), "grants": serializers.ListField()})})
@api_view(["GET"])
def me(request):
    """Who you are, and your grants with what you have spent under each accountant."""
    grants = Grant.objects.filter(analyst=request.user, revoked_at__isnull=True).select_related("dataset", "analyst")
    return Response({
        "username": request.user.username,
        "role": role_of(request.user),
        "grants": s.GrantSerializer(grants, many=True).data,
    })


@extend_schema(request=s.ComposeInputSerializer, responses={200: inline_serializer("Composition", {
    name: serializers.DictField() for name in ACCOUNTANTS})})
@api_view(["POST"])
@permission_classes([IsAuthenticated])
def compose(request):
    """Compose a list of events under every accountant at a target delta (pure maths; no ledger)."""
    data = s.ComposeInputSerializer(data=request.data)
    data.is_valid(raise_exception=True)
    from ..accounting.events import parse_events

    with ledger.event_errors():
        events = parse_events(data.validated_data["events"])
        return Response({name: acc.compose(events, data.validated_data["delta"]).as_dict()
                         for name, acc in ACCOUNTANTS.items()})


class RequestViewSet(FormatSuffix, mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     viewsets.GenericViewSet):
    """Requests to engines. An analyst sees only their own; results only ever go to the
    analyst who asked. POST plans, gates and queues; GET shows status, progress, the charge
    under each accountant and, when ready, the result."""

    serializer_class = s.RequestSerializer
    filterset_fields = {"status": ["exact"], "dataset__name": ["exact"], "engine": ["exact"], "kind": ["exact"]}

    def get_throttles(self):
        from ..security import RequestCreationThrottle

        return [RequestCreationThrottle()] if self.action == "create" else []
    ordering_fields = ["created_at"]

    def filter_queryset(self, queryset):
        # ?status=, ?kind=, ... filter the list. On a detail route (the status poll, cancel)
        # they would only build a FilterSet per request (~1 ms) to no purpose, as for datasets.
        if self.action != "list":
            return queryset
        return super().filter_queryset(queryset)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Request.objects.none()
        qs = Request.objects.select_related("dataset", "analyst", "ledger_entry").order_by("-created_at")
        if is_officer(self.request.user):
            return qs
        return qs.filter(analyst=self.request.user)

    @extend_schema(request=s.RequestCreateSerializer,
                   parameters=[OpenApiParameter(
                       "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
                       description="Any 1 to 200 printable ASCII characters, new for each request (e.g. a UUID). "
                                   "A POST retried with the same key (the first answer was lost) returns the "
                                   "first request as it is now, with the header Idempotent-Replayed: true, and "
                                   "is not charged again; the same key with other parameters gives 422.")],
                   responses={202: s.RequestSerializer, 200: s.RequestSerializer})
    def create(self, request):
        """Plan the request (no data read), pass its event through the gate (409 with the
        numbers if it does not fit) and queue it (202). An identical request you already got
        answered is replayed from the stored release at no cost (200, ``replayed: true``)."""
        from ..submission import submit

        key = _idempotency_key(request)
        data = s.RequestCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        ds = visible_datasets(request.user).filter(name=v["dataset"]).first()
        if ds is None:
            raise InvalidRequest(f"No dataset {v['dataset']!r} that you may use.", errors={"dataset": "not found"})
        req, replayed = submit(request.user, ds, v["engine"], v["kind"], v["params"], idempotency_key=key)
        repeated = getattr(req, "repeated", False)
        req = self.get_queryset().get(pk=req.pk)
        replayed = replayed or (repeated and req.replay_of_id is not None)
        response = Response(s.RequestSerializer(req, context={"request": request}).data,
                            status=status.HTTP_200_OK if replayed else status.HTTP_202_ACCEPTED)
        if repeated:
            response["Idempotent-Replayed"] = "true"
        return response

    @extend_schema(request=None, responses=s.RequestSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel: a queued request is cancelled and refunded; a running one is asked to stop
        (its data was read, the charge stands); a finished one gives 409."""
        from ..submission import cancel

        req = self.get_object()
        if req.analyst_id != request.user.pk and not is_officer(request.user):
            raise exceptions.NotFound()
        req = cancel(req)
        return Response(s.RequestSerializer(self.get_queryset().get(pk=req.pk), context={"request": request}).data)

    @extend_schema(
        parameters=[OpenApiParameter("name", str, OpenApiParameter.PATH, description="a name from result.files")],
        responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="the file"),
                   404: OpenApiResponse(description="no such file, or not your request")})
    @action(detail=True, methods=["get"], url_path=r"files/(?P<name>[^/]+)")
    def files(self, request, pk=None, name=None):
        """Download a file the request released (a trained model, a plot, a table): listed
        with its size and SHA-256 in ``result.files``. Only the analyst who asked may."""
        from ..execution import results_dir

        req = self.get_object()
        listed = {f["name"] for f in ((req.result or {}).get("files") or [])}
        if req.analyst_id != request.user.pk or req.status != Request.Status.SUCCEEDED or name not in listed:
            raise exceptions.NotFound("No such file for this request.")
        path = results_dir(req.replay_of_id or req.pk) / name
        if not path.is_file():
            raise exceptions.NotFound("The file is no longer stored.")
        return _file_response(path, name)

    @extend_schema(
        parameters=[OpenApiParameter("name", str, OpenApiParameter.PATH,
                                     description="a name from officer_report.files")],
        responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="the file"),
                   404: OpenApiResponse(description="no such file, or not a privacy officer")})
    @action(detail=True, methods=["get"], url_path=r"officer-files/(?P<name>[^/]+)")
    def officer_files(self, request, pk=None, name=None):
        """Download a file of the officer's report (e.g. a synthetic table's quality and
        privacy report as HTML): privacy officers only; they are computed on the private rows."""
        from ..execution import results_dir

        req = self.get_object()
        listed = {f["name"] for f in ((req.officer_report or {}).get("files") or [])}
        if not is_officer(request.user) or name not in listed:
            raise exceptions.NotFound("No such file for this request.")
        path = results_dir(req.replay_of_id or req.pk) / "officer" / name
        if not path.is_file():
            raise exceptions.NotFound("The file is no longer stored.")
        return _file_response(path, name)


IDEMPOTENCY_KEY_RE = re.compile(r"[\x20-\x7e]{1,200}")


def _idempotency_key(request) -> str:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return ""
    if not IDEMPOTENCY_KEY_RE.fullmatch(key):
        raise InvalidRequest("The Idempotency-Key header must be 1 to 200 printable ASCII characters.",
                             errors={"Idempotency-Key": "1 to 200 printable ASCII characters"})
    return key


def _file_response(path, name: str) -> FileResponse:
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return FileResponse(open(path, "rb"), as_attachment=True, filename=name, content_type=kind)


@extend_schema(responses={200: inline_serializer("Engines", {"results": serializers.ListField()})})
@api_view(["GET"])
def engines_list(request):
    """The loaded engines: name, request kinds, queue and a JSON schema of each kind's parameters."""
    from engines import plugins

    return Response({"results": sorted(plugins.engines().values(), key=lambda e: e["name"])})
