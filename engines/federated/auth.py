"""Site authentication: a shared secret per site, an HMAC on every reply.

The service registers each site with a secret (``Federation.site_keys``); the site agent
holds the same secret (``--key``, read from a file the SuperNode's ClientApp opens). Every
message the ServerApp sends carries a fresh random nonce; the site's reply carries its
site id, the dataset it serves and ``mac = HMAC-SHA256(secret, nonce | round | site |
dataset | kind | SHA-256 of the payload arrays)``. The ServerApp accepts a reply only from
a registered site whose MAC verifies, for the dataset of the run, on the node that first
proved that site's identity in this run (a second node claiming the same site is refused).
A reply that fails any of these is never aggregated.

Flower's own SuperNode authentication (``--enable-supernode-auth`` with per-node keys) is
complementary: it decides which nodes may connect to the SuperLink at all; this check
decides which site a node speaks for and which dataset it may serve.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np


def digest(arrays: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def mac(secret: str, *, nonce: str, round: int, site: str, dataset: str, kind: str, payload: str) -> str:
    msg = json.dumps([nonce, int(round), site, dataset, kind, payload], separators=(",", ":")).encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def verify(secret: str | None, tag: str, **fields) -> bool:
    if not secret or not isinstance(tag, str):
        return False
    return hmac.compare_digest(mac(secret, **fields), tag)


def split_seed(secret: str, nonce: str) -> bytes:
    """The site's held-out split for one run: stable across the run's rounds (each round's
    ClientApp is a new process), unknown to anyone without the site's secret."""
    return hmac.new(secret.encode(), f"split|{nonce}".encode(), hashlib.sha256).digest()[:16]
