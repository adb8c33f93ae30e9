"""The site agent: a Flower SuperNode serving one dataset from one local table.

    python -m engines.federated.site --superlink HOST:PORT --table rows.parquet \\
        --dataset NAME --site SITE_ID --key SECRET|@FILE [--insecure] [--root-certificates CA.pem]

The rows never leave the site: the SuperNode's ClientApp reads ``--table`` (CSV or
Parquet) per round and sends only a clipped model update and held-out sums (``siteapp``).
``--key`` is the secret the service registered for this site (``@path`` reads it from a
file; an inline secret is written to a 0600 file in the agent's private directory, which
the node config names, so it is not on the SuperNode's command line). The agent serves
only ``--dataset``: a run for any other dataset is refused by the ClientApp.

The agent keeps its SuperNode running: one that ends on its own (the SuperLink restarted,
which keeps its nodes in memory and tells a node it no longer knows to terminate; or the
SuperLink away past the node's retries) is started again after 2 s, then after up to 60 s
while it keeps ending at once; the agent itself stops on SIGTERM or SIGINT.

``--misbehave nan|oversized`` is a fault-injection switch for the tests (a site sending a
NaN or an unclipped update): never set it in production.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import processes

RESTART_FIRST, RESTART_MAX = 2.0, 60.0  # seconds before a SuperNode that ended is started again


def node_config(site: str, dataset: str, table: str, key_file: str, misbehave: str = "") -> str:
    def q(v: str) -> str:
        if '"' in v or "\\" in v:
            raise ValueError(f"unsupported character in {v!r}")
        return f'"{v}"'

    parts = [f"site={q(site)}", f"dataset={q(dataset)}", f"table={q(table)}", f"key-file={q(key_file)}"]
    if misbehave:
        parts.append(f"misbehave={q(misbehave)}")
    return " ".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engines.federated.site", description=__doc__.split("\n\n")[0])
    p.add_argument("--superlink", required=True, help="the service's SuperLink, host:port")
    p.add_argument("--table", required=True, help="the local table (.csv or .parquet)")
    p.add_argument("--dataset", required=True, help="the one dataset this site serves")
    p.add_argument("--site", required=True, help="the site id the service registered")
    p.add_argument("--key", required=True, help="the site's secret, or @file")
    p.add_argument("--insecure", action="store_true", help="plain HTTP to the SuperLink (localhost tests only)")
    p.add_argument("--root-certificates", help="CA bundle of the SuperLink's TLS certificate")
    p.add_argument("--port", type=int, default=0, help="the SuperNode's local runtime port (0: a free one)")
    p.add_argument("--workdir", help="private directory for the agent (default: a new temp dir)")
    p.add_argument("--misbehave", choices=["", "nan", "oversized", "inflate_eval"], default="",
                   help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    work = Path(a.workdir or tempfile.mkdtemp(prefix=f"site-{a.site}-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o700)
    if a.key.startswith("@"):
        key_file = str(Path(a.key[1:]).resolve())
    else:
        key_path = work / "site.key"
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(a.key)
        key_file = str(key_path)
    table = str(Path(a.table).resolve())
    config = node_config(a.site, a.dataset, table, key_file, a.misbehave)
    home = work / "flwr-home"
    home.mkdir(exist_ok=True)
    stopping: list[int] = []
    proc: subprocess.Popen | None = None

    def forward(signum, _frame):
        stopping.append(signum)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    delay = RESTART_FIRST
    while True:
        # every site agent ended for good when the SuperLink restarted, and the next run
        # found no site (a probe): the SuperNode is started again instead
        cmd = processes.supernode_cmd(a.superlink, config, a.port or processes.free_port(), insecure=a.insecure)
        if a.root_certificates:
            cmd += ["--root-certificates", a.root_certificates]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, env=processes.env(home))
        code = proc.wait()
        if stopping:
            return code
        if time.monotonic() - started > RESTART_MAX:  # it had been running: the short wait again
            delay = RESTART_FIRST
        print(f"site {a.site}: the SuperNode ended (exit {code}); starting it again in {delay:g} s",
              file=sys.stderr, flush=True)
        time.sleep(delay)
        if stopping:
            return code
        delay = min(2 * delay, RESTART_MAX)


if __name__ == "__main__":
    sys.exit(main())
