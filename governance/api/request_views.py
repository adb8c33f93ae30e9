"""Requests to engines: submit (plan, gate, queue), status, result files, cancel; the engine list.
"""

import logging
import re

from django.db import InterfaceError, OperationalError
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.response import Response

from ..core.dispatch import app
from ..core.errors import InvalidRequest
from ..core.roles import is_officer
from ..core.security import still_signed_in
from ..datasets.registry import NAME_RE
from ..models import Request
from ..requests.waiting import MAX_WAIT_SECONDS, apply_final_state, parse_wait, wait_final, wait_slot
from . import serializers as s
from .common import FILE_TYPES, FormatSuffix, file_response, own_rows, usable_dataset, visible_datasets, visible_request

log = logging.getLogger(__name__)

WAIT_PARAM = OpenApiParameter(
    "wait", float, OpenApiParameter.QUERY, required=False,
    description=f"Seconds (0 to {MAX_WAIT_SECONDS:g}) to wait for the request to be final before answering, "
                "instead of polling: the answer comes as soon as the worker has written the outcome (on a tick "
                "of the dataset's release clock), or when the time is up, showing the request as it then is. "
                "Other values give 400 request.invalid.")


# a released file's answer, in the type of its suffix (common.FILE_TYPES)
FILE_ANSWERS = {(200, kind): OpenApiResponse(OpenApiTypes.BINARY, description="the file, as an attachment")
                for kind in dict.fromkeys(FILE_TYPES.values())}


class RequestViewSet(FormatSuffix, mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     viewsets.GenericViewSet):
    """Requests to engines. An analyst sees only their own; results only ever go to the
    analyst who asked. POST plans, gates and queues; GET shows status, progress, the charge
    under each accountant and, when ready, the result."""

    serializer_class = s.RequestSerializer
    filterset_fields = {"status": ["exact"], "dataset__name": ["exact"], "engine": ["exact"], "kind": ["exact"]}

    def get_throttles(self):
        from ..core.security import RequestCreationThrottle

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
            return qs.defer("result")  # never shown to an officer (and can be megabytes)
        return own_rows(qs, self.request.user)

    @extend_schema(request=s.RequestCreateSerializer,
                   parameters=[OpenApiParameter(
                       "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
                       description="Any 1 to 200 printable ASCII characters, new for each request (e.g. a UUID). "
                                   "A POST retried with the same key (the first answer was lost) returns the "
                                   "first request as it is now, with the header Idempotent-Replayed: true, and "
                                   "is not charged again; the same key with other parameters gives 422."),
                       WAIT_PARAM],
                   responses={202: s.RequestSerializer, 200: s.RequestSerializer})
    def create(self, request):
        """Plan the request (no data read), pass its event through the gate (409 with the
        numbers if it does not fit) and queue it (202). An identical request you already got
        answered is replayed from the stored release at no cost (200, ``replayed: true``).
        With ``?wait=seconds`` the answer waits up to that long for the result (same status
        code; the body shows the request as it is when the wait ends)."""
        from ..requests.submission import resent, submit

        key = _idempotency_key(request)
        wait = _wait(request)
        data = s.RequestCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = dict(data.validated_data)
        translated = None
        if "sql" in v:  # planned into the JSON request it equals (engines/aggregates/sql.py)
            from ..requests.sql import from_sql

            translated = from_sql(v["sql"], v["params"], v.get("dataset"))
            v.update(translated.as_json())
        ds = usable_dataset(request.user, v["dataset"])
        if ds is None and key and (earlier := resent(request.user, key, v["dataset"], v["engine"], v["kind"],
                                                     v["params"])):
            # a retry of a POST whose answer was lost, the dataset closed to her since
            now = self._visible(earlier.pk)
            response = Response(s.request_json(now, request), status=status.HTTP_200_OK if now.replay_of_id is not None
                                else status.HTTP_202_ACCEPTED)
            response["Idempotent-Replayed"] = "true"
            return response
        if ds is None:
            raise InvalidRequest(f"No dataset {v['dataset']!r} that you may use.{_case_hint(request.user, v['dataset'])}",
                                 errors={"dataset": "not found"})
        if translated is not None:
            from ..requests.sql import check_aliases

            check_aliases(translated, ds)
        req, replayed = submit(request.user, ds, v["engine"], v["kind"], v["params"], idempotency_key=key)
        repeated = getattr(req, "repeated", False)
        try:
            if final := self._wait_for(req, wait, in_hand=(ds, request.user)):
                req = final  # read once, when final
            elif wait or repeated or replayed or app().conf.task_always_eager:
                req = self._visible(req.pk)  # as it is now
            else:  # as just committed: the row, its dataset, analyst and reservation are in hand
                req.dataset, req.analyst = ds, request.user
        except (OperationalError, InterfaceError) as exc:
            # Committed already (admitted and reserved, or a replay): only reading it again
            # failed (the database restarting). A 503 "nothing was kept" here told the analyst
            # to POST again, which charges again without an Idempotency-Key: answer with the
            # request as committed instead.
            log.warning("request %s: committed, then the database was unavailable for its answer: %s", req.pk, exc)
            req.dataset, req.analyst = ds, request.user
        replayed = replayed or (repeated and req.replay_of_id is not None)
        response = Response(s.request_json(req, request),
                            status=status.HTTP_200_OK if replayed else status.HTTP_202_ACCEPTED)
        if repeated:
            response["Idempotent-Replayed"] = "true"
        return response

    @extend_schema(parameters=[WAIT_PARAM])
    def retrieve(self, request, pk=None):
        """A request: status, progress, the charge under each accountant and, when ready, the
        result. ``?wait=seconds`` (0 to 30) holds the answer until the request is final or
        the time is up, instead of polling."""
        wait = _wait(request)
        req = self._visible(pk)
        if wait and req.status not in Request.FINAL:
            req = self._wait_for(req, wait) or self._visible(pk)
        return Response(s.request_json(req, request))

    def _visible(self, pk) -> Request:
        """``get_object()`` for a status read, by one written-out statement (``visible_request``)."""
        req = visible_request(self.request.user, pk)
        if req is None:
            raise Http404
        return req

    def _wait_for(self, req, seconds: float, in_hand=None) -> Request | None:
        """``req`` (seen not final) re-read once final, or None if ``seconds`` pass first.
        ``in_hand``: the POST's (dataset, analyst), which the request has (its own, or the
        analyst's repeat or replay on that dataset): only the row and its entry are read."""
        if not seconds or req.status in Request.FINAL:
            return None
        with wait_slot(self.request.user.pk) as granted:
            if not granted:  # her other waits hold their threads: this one answers at once
                return None
            if in_hand is not None:
                # the request just admitted holds its entry: the worker's pushed final state completes it
                from_state = (lambda data: apply_final_state(req, data)) if Request.ledger_entry.is_cached(req) \
                    else None
                final = wait_final(req.pk, seconds, lambda: _final_row(req.pk, *in_hand), from_state)
            else:
                final = wait_final(req.pk, seconds,
                                   lambda: visible_request(self.request.user, req.pk, final_only=True))
        if not still_signed_in(self.request):
            raise exceptions.AuthenticationFailed(
                "Signed out while this call waited (the token was revoked or reissued, or the account deactivated): "
                "nothing is shown.")
        if final is not None and in_hand is not None and visible_request(self.request.user, req.pk) is None:
            # her role changed while it waited (made an auditor: she no longer sees her requests)
            raise exceptions.PermissionDenied("Your role changed while this call waited: the request is no longer "
                                              "yours to see, and nothing is shown.")
        return final

    @extend_schema(request=None, responses=s.RequestSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel: a queued request is cancelled and refunded; a running one is asked to stop
        (refunded if it stops before any row was read; after that the charge stands, and a
        training run is charged for the steps it took); a finished one gives 409."""
        from ..requests.submission import cancel

        req = self.get_object()
        if req.analyst_id != request.user.pk and not is_officer(request.user):
            raise exceptions.NotFound()
        req = cancel(req)
        return Response(s.request_json(self._visible(req.pk), request))

    @extend_schema(
        parameters=[OpenApiParameter("name", str, OpenApiParameter.PATH, description="a name from result.files")],
        responses={**FILE_ANSWERS, 404: OpenApiResponse(description="no such file, or not your request")})
    @action(detail=True, methods=["get"], url_path=r"files/(?P<name>[^/]+)")
    def files(self, request, pk=None, name=None):
        """Download a file the request released (a trained model, a plot, a table): listed
        with its size and SHA-256 in ``result.files``. Only the analyst who asked may."""
        from ..requests.result_files import results_dir

        req = self.get_object()
        listed = {f["name"] for f in ((req.result or {}).get("files") or [])}
        if req.analyst_id != request.user.pk or req.status != Request.Status.SUCCEEDED or name not in listed:
            raise exceptions.NotFound("No such file for this request.")
        path = results_dir(req.replay_of_id or req.pk) / name
        if not path.is_file():
            raise exceptions.NotFound("The file is no longer stored.")
        return file_response(path, name)

    @extend_schema(
        parameters=[OpenApiParameter("name", str, OpenApiParameter.PATH,
                                     description="a name from officer_report.files")],
        responses={**FILE_ANSWERS, 403: OpenApiResponse(description="not a privacy officer"),
                   404: OpenApiResponse(description="no such request or file")})
    @action(detail=True, methods=["get"], url_path=r"officer-files/(?P<name>[^/]+)")
    def officer_files(self, request, pk=None, name=None):
        """Download a file of the officer's report (e.g. a synthetic table's quality and
        privacy report as HTML): privacy officers only; they are computed on the private rows."""
        from ..requests.result_files import results_dir

        if not is_officer(request.user):  # before the lookup: a 403 whether or not the request exists
            raise exceptions.PermissionDenied("Privacy officers only: the officer's report is computed on the "
                                              "private rows.")
        req = self.get_object()
        listed = {f["name"] for f in ((req.officer_report or {}).get("files") or [])}
        if name not in listed:
            raise exceptions.NotFound("No such file for this request.")
        path = results_dir(req.replay_of_id or req.pk) / "officer" / name
        if not path.is_file():
            raise exceptions.NotFound("The file is no longer stored.")
        return file_response(path, name)


def _final_row(pk, dataset, analyst) -> Request | None:
    """The request ``pk`` with its ledger entry if it is final (~0.7 ms less than the
    queryset with three joins, ordering and ``first()``), with ``dataset`` and ``analyst``."""
    row = next(iter(Request.objects.select_related("ledger_entry").filter(pk=pk, status__in=Request.FINAL)
                    .order_by()), None)
    if row is not None:
        row.dataset, row.analyst = dataset, analyst
    return row


IDEMPOTENCY_KEY_RE = re.compile(r"[\x20-\x7e]{1,200}")


def _wait(request) -> float:
    raw = request.query_params.get("wait")
    return 0.0 if raw is None else parse_wait(raw)


def _idempotency_key(request) -> str:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return ""
    if not IDEMPOTENCY_KEY_RE.fullmatch(key):
        raise InvalidRequest("The Idempotency-Key header must be 1 to 200 printable ASCII characters.",
                             errors={"Idempotency-Key": "1 to 200 printable ASCII characters"})
    return key



@extend_schema(responses={200: inline_serializer("Engines", {"results": serializers.ListField()})})
@api_view(["GET"])
def engines_list(request):
    """The loaded engines: name, request kinds, queue and a JSON schema of each kind's parameters."""
    from engines import plugins

    return Response({"results": sorted(plugins.engines().values(), key=lambda e: e["name"])})


def _case_hint(user, name) -> str:
    """The hint " Did you mean 'mplsstops'?" when a dataset the user may use has ``name`` in other
    letter case (SQL's FROM MplsStops; names are case-sensitive); else ""."""
    # names are lowercase: only a name whose lowercase is one can be meant (and the lookup
    # is an equality: a LIKE of a long pattern is an error on SQLite)
    if not isinstance(name, str) or name == name.lower() or not NAME_RE.fullmatch(name.lower()):
        return ""
    other = visible_datasets(user).filter(name=name.lower()).values_list("name", flat=True).first()
    return f" Did you mean {other!r}? (dataset names are case-sensitive)" if other else ""
