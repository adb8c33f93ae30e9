"""Sending tasks by name (governance.core.dispatch): governance never imports workers.tasks, and
workers.tasks imports no sweep to send, so submission -> workers.tasks -> recovery ->
submission is no longer an import cycle. (The same rule is an import-linter contract in
.importlinter, checked by tests/test_import_contracts.py, with indirect imports too.)"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add("." * node.level + node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_no_governance_module_imports_the_tasks():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "governance").rglob("*.py")
                 if any(n == "workers.tasks" or n.startswith("workers.tasks.") for n in _imports(p))]
    assert offenders == []


def test_the_tasks_send_without_recovery_or_submission():
    names = _imports(ROOT / "workers" / "tasks.py")
    assert "governance.core.dispatch.publish_or_mark" in names
    assert not any(n.startswith("governance.requests.submission") for n in names), names
    # the sweep task runs the sweep, and the hard time limit's handler finishes a killed run;
    # nothing imports it to send
    assert {n for n in names if n.startswith("governance.requests.recovery")} == {
        "governance.requests.recovery", "governance.requests.recovery.sweep",
        "governance.requests.recovery.finish_killed_by_time_limit"}


def test_submitting_and_sweeping_load_without_the_tasks_module():
    code = ("import django, sys; django.setup(); "
            "import governance.requests.submission, governance.requests.recovery; "
            "print('workers.tasks' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"DJANGO_SETTINGS_MODULE": "governance.settings", "PATH": "/usr/bin:/bin",
                              "SECRET_KEY": "test", "DEBUG": "true"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
