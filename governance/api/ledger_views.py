"""The ledger (read-only) and the composition calculator."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from accounting import ACCOUNTANTS

from ..core.roles import is_officer
from ..ledger import actions as ledger
from ..ledger.estimates import bounded_work
from ..models import LedgerEntry
from . import serializers as s
from .common import own_rows


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
        return own_rows(qs, self.request.user)


@extend_schema(request=s.ComposeInputSerializer, responses={200: inline_serializer("Composition", {
    name: serializers.DictField() for name in ACCOUNTANTS})})
@api_view(["POST"])
@permission_classes([IsAuthenticated])
def compose(request):
    """Compose a list of events under every accountant at a target delta (pure maths; no
    ledger). Bounded: a list whose RDP curves would take more than about a CPU second is
    refused (400 ``request.too_costly``) before they are computed (``accounting.work``)."""
    data = s.ComposeInputSerializer(data=request.data)
    data.is_valid(raise_exception=True)
    from accounting import work
    from accounting.events import parse_events

    with bounded_work(), ledger.event_errors():
        events = parse_events(data.validated_data["events"])
        work.charge_grid(events)  # the refinement's zooms are charged as they come
        return Response({name: acc.compose(events, data.validated_data["delta"]).as_dict()
                         for name, acc in ACCOUNTANTS.items()})
