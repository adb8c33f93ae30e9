import pytest

ROUTES = ["/api/me/", "/api/engines/", "/api/datasets/", "/api/datasets/clinic/", "/api/datasets/clinic/preview/",
          "/api/datasets/clinic/recommendation/", "/api/datasets/clinic/ledger/", "/api/ledger/", "/api/grants/",
          "/api/analysts/", "/api/requests/", "/api/audit/", "/api/audit/verify/", "/api/audit/export/",
          "/api/schema/", "/api/docs/", "/api/"]

def test_bt_routes(make_dataset, api, officer, auditor):
    make_dataset("clinic")
    bad = []
    for r in ROUTES:
        for p in (r, r.rstrip("/")):
            for who in (officer, auditor):
                resp = api(who).get(p + ("?dataset=clinic" if "export" in p else ""))
                if resp.status_code in (404, 500) or resp.status_code >= 300 and resp.status_code < 400:
                    bad.append((p, who.username, resp.status_code, resp.content[:150]))
    # dotted names
    for p in ["/api/datasets/clinic.json", "/api/datasets/clinic.json/", "/api/requests/00000000-0000-0000-0000-000000000000/files/model.pt",
              "/api/requests/00000000-0000-0000-0000-000000000000/files/a.b.c/", "/api/audit/export.json", "/api/me.json"]:
        resp = api(officer).get(p)
        print(p, resp.status_code, resp.content[:160])
    for b in bad:
        print("BAD", b)
