"""bench/bench_embedded_broker.py at its CI setting (``--quick``: 40 sequential and 40
concurrent DP counts through gunicorn -w 2 and a real worker on the embedded broker, one
run; about 30 s): nothing lost, no worker death. The full setting (500 + 200, 5 runs) is
in bench/README.md."""

import subprocess
import sys

import pytest
from django.db import connection

from .conftest import ROOT


@pytest.mark.django_db
def test_the_embedded_broker_bench_loses_nothing_and_no_worker_dies():
    database = "postgres" if connection.vendor == "postgresql" else "sqlite"
    r = subprocess.run([sys.executable, "bench/bench_embedded_broker.py", "--quick", "--database", database],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    result = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert result, out[-3000:]
    fields = dict(kv.split("=", 1) for kv in result[-1].split()[1:])
    assert fields["lost"] == "0" and fields["worker_deaths"] == "0", out[-3000:]
    assert fields["posted"] == fields["accepted"] == fields["succeeded"] == "80", out[-3000:]
    assert r.returncode == 0, out[-3000:]
