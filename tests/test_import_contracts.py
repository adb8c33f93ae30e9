"""The import contracts in .importlinter: governance's layers (api and web above requests
and audit, above datasets, above the ledger, above core), no import circles inside
governance (imports inside functions count), governance never importing workers.tasks,
and accounting, engines and the client importing neither Django nor governance."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout, out.stdout[-3000:]


def test_every_governance_subpackage_says_what_it_owns_and_may_import():
    for init in sorted((ROOT / "governance").glob("*/__init__.py")):
        if init.parent.name in ("migrations", "management", "templatetags"):
            continue
        doc = init.read_text()
        assert doc.startswith('"""'), init
        assert "May import" in doc and "Must not import" in doc, init
