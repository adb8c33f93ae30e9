"""The README's first command's main job: ``manage.py demo`` end to end, as scripts/demo.sh
runs it (a fresh SQLite database of its own). Nothing ran it before: the streamed audit
export broke its last step (``resp.content`` of a streaming response) and no test saw it."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_runs_end_to_end_and_its_audit_export_recomposes(tmp_path):
    env = {**os.environ, "GOVERNANCE_VAR_DIR": str(tmp_path), "DATABASE_URL": f"sqlite:///{tmp_path}/demo.sqlite3",
           "RESULTS_DIR": str(tmp_path / "results"), "OMP_NUM_THREADS": "1"}
    env.pop("REDIS_URL", None)
    for args in (["migrate", "--verbosity", "0"], ["demo"]):
        out = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=900)
        assert out.returncode == 0, (args, out.stdout[-3000:], out.stderr[-3000:])
    assert "third-party check (tools/recompose_audit.py var/demo-audit.json): exit 0" in out.stdout, out.stdout[-3000:]
    export = json.loads((tmp_path / "demo-audit.json").read_bytes())
    assert export["verification"]["ok"] is True and export["datasets"]
    assert (tmp_path / "demo-audit.pdf").read_bytes()[:5] == b"%PDF-"


def test_the_demo_scripts_closing_hint_serves_the_demo_with_its_files():
    """scripts/demo.sh's last line tells how to browse the demo; it named the database but
    not the results folder, so the report, model and table links the demo printed answered
    404 "no longer stored" (a probe). Every variable the script exports is in the hint."""
    import re

    script = (ROOT / "scripts" / "demo.sh").read_text()
    exported = dict(re.findall(r'^export (\w+)="([^"]+)"', script, flags=re.M))
    assert {"DATABASE_URL", "RESULTS_DIR"} <= set(exported)
    hint = next(line for line in script.splitlines() if "manage.py runserver" in line)
    assert all(f"{name}={value}" in hint for name, value in exported.items()), hint
