"""The Celery no-op of the baseline: it only answers on a Redis list the caller blocks on
(as a worker's finishing commit signals a waiting web thread, governance.requests.waiting)."""

import functools

from celery import shared_task
from django.conf import settings


@functools.cache
def _redis():
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


@shared_task(name="bench.noop", ignore_result=True)
def noop(reply_key: str) -> None:
    _redis().pipeline(transaction=False).rpush(reply_key, 1).expire(reply_key, 60).execute()
