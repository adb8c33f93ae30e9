"""Who may do what: grants, analyst and auditor accounts and their tokens, ``me``.
"""


from django.db import transaction
from drf_spectacular.utils import (
    extend_schema,
    inline_serializer,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authtoken.models import Token
from rest_framework.decorators import action, api_view
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from ..core import roles, tokens
from ..core.errors import InvalidRequest
from ..core.roles import is_officer, role_of, with_auditor_flag
from ..ledger import grants
from ..models import Dataset, Grant
from . import serializers as s
from .common import FormatSuffix, User, own_rows
from .permissions import IsOfficer, OfficerWritesOnly


class GrantViewSet(FormatSuffix, viewsets.ModelViewSet):
    """Grants join an analyst to a dataset, optionally with a cap on their share.
    DELETE revokes (the grant and its history are kept for the ledger). Each grant given,
    re-capped or revoked is a ``grant`` record in the dataset's audit chain."""

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
        # a draft or deactivated dataset is invisible to analysts: its grants too (its name,
        # budget and "auto" delta, whence its exact unit count, showed here: probe CO)
        return own_rows(qs, self.request.user).filter(dataset__status=Dataset.Status.ACTIVE)

    def perform_create(self, serializer):
        """A new grant, or the analyst's revoked one active again: a ``grant`` record in the
        dataset's audit chain (``governance.ledger.grants``)."""
        v = serializer.validated_data
        grant = grants.give(v["analyst"], v["dataset"], self.request.user, cap_epsilon=v.get("cap_epsilon"),
                            cap_delta=v.get("cap_delta"))
        if grant is None:
            raise InvalidRequest(f"{v['analyst']} already holds a grant on {v['dataset']}; PATCH it to change the cap.")
        serializer.instance = grant

    @extend_schema(request=s.GrantUpdateSerializer)
    def partial_update(self, request, pk=None):
        """Change the grant's cap (a ``grant`` record in the dataset's audit chain)."""
        grant = self.get_object()
        data = s.GrantUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        grant = grants.change_cap(grant, request.user, **data.validated_data)
        return Response(self.get_serializer(grant).data)

    def update(self, request, *args, **kwargs):  # PUT is not offered
        raise InvalidRequest("Use PATCH to change a grant's cap.")

    def perform_destroy(self, grant):
        grants.revoke(grant, self.request.user)



class AnalystViewSet(FormatSuffix, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                     viewsets.GenericViewSet):
    """Analyst and auditor accounts and their API tokens (privacy officers only)."""

    serializer_class = s.AnalystSerializer
    permission_classes = [IsAuthenticated, IsOfficer]
    queryset = with_auditor_flag(User.objects.filter(is_staff=False)).order_by("id")  # (officers' tokens: not here)

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

                user.groups.add(Group.objects.get_or_create(name=roles.AUDITORS_GROUP)[0])
            token = Token.objects.create(user=user)
        return Response({"id": user.pk, "username": user.username, "role": data.validated_data["role"],
                         "token": token.key}, status=201)

    @extend_schema(methods=["POST"], request=None,
                   responses={200: inline_serializer("NewToken", {"token": serializers.CharField()})})
    @extend_schema(methods=["DELETE"], request=None, responses={204: None})
    @action(detail=True, methods=["post", "delete"])
    def token(self, request, pk=None):
        """POST: issue a new API token for the analyst (the old one stops working; tokens
        expire API_TOKEN_TTL_DAYS after issue). DELETE: revoke it, issuing none."""
        user = self.get_object()
        if request.method == "DELETE":
            tokens.revoke(user)  # ...and the web sessions opened with it
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response({"token": tokens.issue(user, by=request.user).key})


@extend_schema(responses={200: inline_serializer("Me", {
    "username": serializers.CharField(), "role": serializers.CharField(), "grants": serializers.ListField()})})
@api_view(["GET"])
def me(request):
    """Who you are, and your grants with what you have spent under each accountant."""
    grants = own_rows(Grant.objects.filter(revoked_at__isnull=True, dataset__status=Dataset.Status.ACTIVE),
                      request.user).select_related("dataset", "analyst")
    return Response({
        "username": request.user.username,
        "role": role_of(request.user),
        "grants": s.GrantSerializer(grants, many=True).data,
    })

