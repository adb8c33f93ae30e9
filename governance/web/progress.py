"""A request's progress as one line of the officer's pages (the request list, a dataset's
page): the phase and fraction, and for a federated run its round, epsilon spent so far, the
sites whose updates were accepted and the last DP evaluation with its 95% interval."""

from __future__ import annotations


def progress_text(progress) -> str:
    p = progress if isinstance(progress, dict) else {}
    frac = p.get("fraction")
    text = str(p.get("phase", ""))
    if isinstance(frac, (int, float)):
        text += f" {frac:.0%}"
    if p.get("round") is not None:
        text += f" · round {p.get('round')}/{p.get('rounds')}"
        if isinstance(p.get("epsilon_spent"), (int, float)):
            text += f", epsilon {p['epsilon_spent']:.3g}"
        sites = p.get("sites")
        if isinstance(sites, dict) and isinstance(sites.get("accepted"), list):
            text += f", {len(sites['accepted'])} site(s) aggregated"
        evals = [h for h in p.get("history") or [] if isinstance(h, dict) and h.get("accuracy") is not None]
        if evals:
            ci = evals[-1].get("accuracy_ci95")
            text += f", DP accuracy {evals[-1]['accuracy']:.3f}"
            if isinstance(ci, list) and len(ci) == 2:
                text += f" (95% {ci[0]:.3f}-{ci[1]:.3f})"
    elif p.get("phase") == "sites" and isinstance(p.get("connected"), list):
        text += f" · {len(p['connected'])} connected, {len(p.get('refused') or [])} refused"
    return text.strip()
