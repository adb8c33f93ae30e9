"""The database's clock, for what several processes and hosts stamp and judge by age."""

from django.db import connection
from django.utils import timezone


def db_now():
    """The database's clock: one clock for every process and host that writes heartbeats
    and sweeps them (``db_time``). SQLite is one host's file: its clock is this one's."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cur:
        cur.execute("SELECT STATEMENT_TIMESTAMP()")
        return cur.fetchone()[0]
