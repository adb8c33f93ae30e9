"""The production URLs plus the baselines, with the service's authentication, permission,
parsers and renderers (DRF defaults from settings):

- ``POST /bench/insert/``: a bare DRF endpoint that inserts one row (one INSERT in a
  transaction) and answers 201 with its id;
- ``POST /bench/path/``: the same insert, then a Celery no-op round trip (send the task,
  block until the worker's reply), i.e. the bare shape of a request answered in one call.
"""

import uuid

from django.conf import settings
from django.db import connection, transaction
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from governance.urls import urlpatterns as production

from .tasks import _redis


def insert_row(user_id: int) -> int:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"INSERT INTO {settings.BENCH_TABLE} (analyst_id, payload, created_at) "
                    "VALUES (%s, %s, CURRENT_TIMESTAMP) RETURNING id", [user_id, '{"epsilon": 1e-06}'])
        return cur.fetchone()[0]


def noop_round_trip(timeout: float = 30.0) -> bool:
    from workers import app

    key = f"bench:noop:{uuid.uuid4().hex}"
    app.send_task("bench.noop", args=[key], queue="cpu")
    return _redis().blpop([key], timeout=timeout) is not None


class Insert(APIView):
    def post(self, request):
        return Response({"id": insert_row(request.user.pk)}, status=201)


class InsertAndNoop(APIView):
    def post(self, request):
        row = insert_row(request.user.pk)
        return Response({"id": row, "answered": noop_round_trip()}, status=201)


urlpatterns = [path("bench/insert/", Insert.as_view()), path("bench/path/", InsertAndNoop.as_view())] + production
