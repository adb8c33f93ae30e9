"""What the federated engine needs from the host beyond ``DatasetMeta`` (plain data).

- ``FederatedDatasetMeta``: a dataset whose rows stay at its sites. ``sites`` are the
  registered sites with their public row counts, e.g. ``({"site": "h1", "n_rows": 1200},
  ...)``; the number of registered sites fixes the sampling rate q = sites_per_round /
  len(sites). ``n_rows``/``n_units`` are the sums over the sites.
- ``Federation``: how a run reaches the sites, given to ``run`` in place of a table (the
  rows never come to the service): the SuperLink's address (its HTTP port, where the
  SuperNodes and ``flwr run`` connect) and each registered site's secret, which the
  ServerApp uses to check the site's HMAC on every reply. Secrets never go into a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engines.types import DatasetMeta


@dataclass(frozen=True)
class FederatedDatasetMeta(DatasetMeta):
    sites: tuple = ()


@dataclass(frozen=True)
class Federation:
    superlink: str  # host:port of the SuperLink (one HTTP port serves Fleet, Control and Runtime APIs in flwr 1.42)
    site_keys: dict = field(default_factory=dict)  # site id -> shared secret (str)
    insecure: bool = True  # plain HTTP on a trusted network (localhost in tests); TLS: root_certificates
    root_certificates: str | None = None
    wait_sites_seconds: float = 30.0  # how long the first round waits for sampled sites to connect
    round_timeout: float = 120.0  # a sampled site that has not replied by then is dropped from the round
