"""Starting Flower's processes: the service's SuperLink and a site's SuperNode.

flwr 1.42 serves the Fleet API (SuperNodes), the Control API (``flwr run``) and the
Runtime API (the ServerApp and ClientApp processes) over one HTTP port (``--port``). The
SuperLink starts the ServerApp of each run in a subprocess (``flwr-serverapp``) and each
SuperNode starts a ClientApp process per message (``flwr-clientapp``): both must find the
venv's executables on PATH and import ``engines`` (PYTHONPATH: the repository root).
Runtime dependency installation is off (the FAB's dependencies are this venv's).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
POLL = "0.1"  # seconds between a SuperExec's polls for work (flwr's default 1 s)


def env(flwr_home: Path) -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), e.get("PYTHONPATH", "")]))
    e["FLWR_HOME"] = str(flwr_home)
    e["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = POLL
    e["FLWR_TELEMETRY_ENABLED"] = "0"
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout:g} s")


def start_superlink(workdir: Path, port: int | None = None, log=None) -> tuple[subprocess.Popen, str]:
    """A SuperLink on 127.0.0.1 (insecure: for tests and one-host setups), in-memory state.
    Returns (process, "127.0.0.1:port"); the caller stops it (``stop``)."""
    port = port or free_port()
    home = workdir / "superlink-home"
    home.mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
           "--fleet-api-address", f"127.0.0.1:{free_port()}", "--control-api-address", f"127.0.0.1:{free_port()}",
           "--disable-runtime-dependency-installation"]
    out = log or open(workdir / f"superlink-{port}.log", "ab")
    proc = subprocess.Popen(cmd, env=env(home), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_port(port, proc=proc)
    return proc, f"127.0.0.1:{port}"


def supernode_cmd(superlink: str, node_config: str, port: int, insecure: bool = True) -> list[str]:
    cmd = [str(BIN / "flower-supernode"), "--superlink", superlink, "--host", "127.0.0.1", "--port", str(port),
           "--node-config", node_config, "--max-retries", "1000"]
    return cmd + (["--insecure"] if insecure else [])


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a process started here and its children (its own session/process group)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, 15)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait(5)
