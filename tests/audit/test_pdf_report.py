"""The PDF audit report (governance.audit.pdf) on export dicts built here: no database.

Text is looked for in the uncompressed PDF (``render_pdf(..., compress=False)``): the
built-in fonts write each line as a literal string, ``(...) Tj``.
"""

import hashlib
import json
import math
import re
from datetime import UTC, datetime, timedelta

from governance.audit.pdf import render_pdf

GENESIS = "0" * 64
START = datetime(2026, 1, 1, tzinfo=UTC)
DELTA = 1e-5
THEOREMS = {
    "basic": "Basic composition (Dwork-Roth 2014, Thm. 3.16); filter: Rogers et al. 2016, Thm. 3.6",
    "advanced": "Advanced composition, heterogeneous (Kairouz-Oh-Viswanath 2015, Thm. 3.5); filter: "
                "Whitehouse-Ramdas-Rogers-Wu 2023",
    "rdp": "Rényi DP (Mironov 2017) with the conversion of Balle et al. 2020, Thm. 21; filter: Feldman-Zrnic 2021",
}
USER_REF = "ref <b>& co"
USER_DETAIL = "over <b>&amp; cap"
BROKEN_PROBLEM = "its hash does not match its content (the record was edited)"

# actions in the order they repeat; every commit of "bob" is by the second analyst
PATTERN = [("commit", "ann"), ("commit", "bob"), ("release", "bob"), ("refuse", "ann"), ("commit", "ann"),
           ("replay", "bob"), ("refuse", "bob")]


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
                          ).hexdigest()


def _totals(basic: float, rdp: float) -> dict:
    def cost(eps, delta):
        return {"epsilon": eps if math.isfinite(eps) else "inf", "delta": delta}

    return {"at_delta": DELTA, "basic": cost(basic, 0.0), "advanced": cost(basic, DELTA), "rdp": cost(rdp, DELTA)}


def make_records(name: str, n: int, *, with_inf: bool = False) -> list[dict]:
    """``n`` chained records of dataset ``name``: the PATTERN repeated; with ``with_inf`` the
    last commit is a non-private release charged epsilon "inf"."""
    records, prev, basic, sq = [], GENESIS, 0.0, 0.0
    last_commit = max((i for i in range(n) if PATTERN[i % len(PATTERN)][0] == "commit"), default=-1)
    for i in range(n):
        action, actor = PATTERN[i % len(PATTERN)]
        charge, event, non_private = None, {"kind": "laplace", "epsilon": 0.05}, False
        if action == "commit":
            eps = math.inf if with_inf and i == last_commit else 0.05
            non_private = math.isinf(eps)
            basic += eps
            sq += eps * eps
            eps_json = "inf" if math.isinf(eps) else eps
            charge = {"basic": {"epsilon": eps_json, "delta": 0.0}, "advanced": {"epsilon": eps_json, "delta": DELTA},
                      "rdp": {"epsilon": eps_json if math.isinf(eps) else eps * 0.99, "delta": DELTA, "order": 64.0}}
        rdp = math.sqrt(sq) * 4 if math.isfinite(sq) else math.inf
        body = {
            "seq": i + 1, "dataset": name, "action": action,
            "at": (START + timedelta(seconds=30 * i)).isoformat(timespec="microseconds"),
            "actor": actor, "request": None if action == "refuse" else f"req-{i}",
            "ledger_entry": i + 1 if action in ("commit", "release") else None,
            "reference": USER_REF if action in ("commit", "release") else "", "engine": "aggregates", "kind": "count",
            "params": {"column": "age"},
            "outcome": {"commit": "succeeded", "release": "failed", "refuse": "refused", "replay": "replayed"}[action],
            "reason": "budget.exceeded" if action == "refuse" else "",
            "detail": USER_DETAIL if action == "refuse" else "", "event": None if action == "replay" else event,
            "reserved_event": None, "charge": charge, "totals": _totals(basic, rdp), "non_private": non_private,
            "result_sha256": "ab" * 32 if action == "commit" else "",
            "worker": "cpu@host" if action == "commit" else "",
            "requested_at": None, "prev_hash": prev,
        }
        prev = _digest(body)
        records.append(body | {"hash": prev})
    return records


def export_dataset(name: str, n: int, *, policy: str = "rdp", epsilon: float = 3.0, with_inf: bool = False) -> dict:
    records = make_records(name, n, with_inf=with_inf)
    counts = {"commit": 0, "release": 0, "refuse": 0, "replay": 0, "non_private": 0}
    for r in records:
        counts[r["action"]] += 1
        counts["non_private"] += r["action"] == "commit" and r["non_private"]
    totals = records[-1]["totals"] if records else _totals(0.0, 0.0)
    spent = {a: totals[a]["epsilon"] for a in ("basic", "advanced", "rdp")}
    return {
        "name": name, "title": f"{name.title()} <i>& friends", "unit_column": None, "n_units": 1000,
        "sha256": "cd" * 32, "budget": {"epsilon": epsilon, "delta": DELTA, "policy": policy, "delta_auto": True},
        "head": {"seq": len(records), "hash": records[-1]["hash"] if records else GENESIS},
        "totals": totals, "spent_filter": spent, "counts": counts, "records": records,
    }


def make_export(n: int = 14, *, broken: bool = False, datasets=None) -> dict:
    """An export as governance.audit.export.build makes it: "survey" (rdp, ``n`` records,
    an "inf" charge at the end) and "census" (basic, a few records)."""
    if datasets is None:
        datasets = [export_dataset("survey", n, with_inf=True), export_dataset("census", 5, policy="basic", epsilon=1.0)]
    n_records = sum(len(ds["records"]) for ds in datasets)
    verification = {"ok": True, "datasets": len(datasets), "records": n_records,
                    "heads": {ds["name"]: ds["head"] for ds in datasets}, "first_broken": None, "problems": []}
    if broken:
        verification |= {"ok": False, "first_broken": {"dataset": "survey", "seq": 3, "record_id": 3,
                                                      "problem": BROKEN_PROBLEM},
                         "problems": [f"dataset survey: record 3 (id 3): {BROKEN_PROBLEM}",
                                      "dataset survey: the chain: ledger entry 9 has no audit record"]}
    return {
        "format": "privacy-audit/1", "generated_at": "2026-02-01T12:00:00+00:00", "generated_by": "olivia",
        "hashing": {"algorithm": "sha256", "genesis": GENESIS,
                    "canonical": 'json.dumps(record without "hash", sort_keys=True, separators=(",", ":"), '
                                 "ensure_ascii=False).encode()"},
        "accounting": {name: {"theorem": theorem, "gates_with": "filter_epsilon",
                              "doc": f"The {name} accountant.\n\nGate rule: halt before the {name} filter exceeds "
                                     "the budget.\n"}
                       for name, theorem in THEOREMS.items()},
        "verification": verification,
        "datasets": datasets,
    }


def pdf_text(data: bytes) -> str:
    """The text drawn in an uncompressed PDF: the strings of a line (up to ``T*``/``ET``)
    joined, one line per line, whitespace collapsed."""
    lines, line = [], []
    for m in re.finditer(rb"\(((?:\\.|[^\\)])*)\)\s*Tj|T\*|\bET\b", data, re.DOTALL):
        if m.group(1) is None:
            if line:
                lines.append(" ".join(b"".join(line).decode("cp1252").split()))
            line = []
            continue
        line.append(re.sub(rb"\\([0-7]{1,3}|.)", lambda e: bytes([int(e.group(1), 8)]) if e.group(1).isdigit()
                           else {b"n": b"\n", b"r": b"\r", b"t": b"\t"}.get(e.group(1), e.group(1)), m.group(1)))
    return "\n".join(lines)


def render_text(export: dict) -> str:
    data = render_pdf(export, compress=False)
    assert data.startswith(b"%PDF")
    assert data.rstrip().endswith(b"%%EOF")
    return pdf_text(data)


def test_renders_a_pdf():
    data = render_pdf(make_export())
    assert data.startswith(b"%PDF")
    assert data.rstrip().endswith(b"%%EOF")
    assert len(data) > 10_000  # charts embedded


def test_uncompressed_output_is_deterministic():
    export = make_export()
    assert render_pdf(export, compress=False) == render_pdf(export, compress=False)


def test_content():
    text = render_text(make_export())
    assert "Privacy audit report" in text
    assert "Chain verified" in text and "FAILED" not in text
    for name in ("survey", "census"):
        assert name in text
    for section in ("Summary", "Budget burn-down", "Releases per analyst", "Accounting rules", "How to verify"):
        assert section in text
    for theorem in ("Basic composition (Dwork-Roth 2014, Thm. 3.16)", "Kairouz-Oh-Viswanath 2015",
                    "Rényi DP (Mironov 2017)"):
        assert theorem in text
    lines = set(text.splitlines())
    assert {"ann", "bob"} <= lines  # the analysts' rows
    assert "python tools/recompose_audit.py export.json" in text
    assert GENESIS in text
    assert make_export()["datasets"][0]["head"]["hash"] in text  # head hash on page 1
    assert "inf" in lines  # the non-private release's charge and the totals after it
    assert "page 1" in text and "page 3" in text


def test_user_text_is_escaped_not_markup():
    text = render_text(make_export())
    assert USER_REF in text  # "<b>&" shown as typed, not bold markup
    assert USER_DETAIL in text
    assert "Survey <i>& friends" in text


def test_broken_verification_is_reported():
    text = render_text(make_export(broken=True))
    assert "Chain verification FAILED" in text
    assert "Chain verified" not in text
    assert BROKEN_PROBLEM in text
    assert "ledger entry 9 has no audit record" in text


def test_broken_verification_is_red():
    datasets = [export_dataset("survey", 10)]  # within budget: nothing else is red
    data = render_pdf(make_export(broken=True, datasets=datasets), compress=False)
    ok = render_pdf(make_export(datasets=datasets), compress=False)
    red = b".690196 0 .12549 rg"  # #b00020 as the text fill colour
    assert red in data and red not in ok


def test_empty_exports_render():
    empty_ds = export_dataset("fresh", 0)
    text = render_text(make_export(datasets=[empty_ds]))
    assert "fresh" in text and "No records yet" in text
    text = render_text(make_export(datasets=[]))
    assert "no datasets" in text
    bare = render_pdf({"datasets": []})
    assert bare.startswith(b"%PDF")


def test_many_records_and_analysts():
    ds = export_dataset("big", 5000)
    for i, r in enumerate(ds["records"]):
        r["actor"] = f"analyst{i % 50}$\\x$"  # not matplotlib mathtext (where "\\x" is an error)
    text = render_text(make_export(datasets=[ds]))
    assert "one record in 3 plotted" in text  # downsampled burn-down
    assert "the last 30 shown" in text
    assert "analyst0$\\x$" in text
    assert "The 40 analysts with the most releases of 50" in text


def test_text_outside_the_fonts_does_not_break():
    ds = export_dataset("survey", 8)
    ds["records"][-1]["reference"] = ds["records"][-2]["reference"] = "ε=1 ✓ 中文 \x00\x07 tab\tend"
    ds["records"][-1]["actor"] = "ε-user"
    text = render_text(make_export(datasets=[ds]))
    assert "epsilon=1 ? ?? tab end" in text
    assert "epsilon-user" in text


def test_page_streams_are_compressed_by_default():
    assert b"(Privacy audit report) Tj" in render_pdf(make_export(), compress=False)
    assert b"(Privacy audit report) Tj" not in render_pdf(make_export())


def test_texts_of_a_hundred_thousand_characters_are_cut_not_a_layout_error():
    """An export from elsewhere (pdf.py renders any): a 100,000-character name or author
    made a table row taller than a page (reportlab's LayoutError)."""
    long = "x" * 100_000
    ds = export_dataset(long, 4)
    ds["title"] = long
    for rec in ds["records"]:
        rec.update(actor=long, reference=long, detail=long, reason=long, engine=long)
    export = make_export(datasets=[ds])
    export.update(generated_by=long, generated_at=long, format=long)
    export["verification"] |= {"ok": False, "first_broken": {"dataset": long, "seq": long, "problem": long},
                               "problems": [long] * 3}
    data = render_pdf(export, compress=False)
    assert data[:5] == b"%PDF-" and "x" * 150 in pdf_text(data)
