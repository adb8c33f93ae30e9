"""Small federated datasets for the tests: a table split over sites, its declared schema."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engines.federated.types import FederatedDatasetMeta

COLUMNS = {
    "x1": {"type": "numeric", "lower": -3.0, "upper": 3.0},
    "x2": {"type": "numeric", "lower": -3.0, "upper": 3.0},
    "color": {"type": "categorical", "domain": ["red", "green", "blue"]},
    "label": {"type": "categorical", "domain": ["no", "yes"]},
}


def make_table(n: int, seed: int, shift: float = 0.0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x1 = rng.normal(shift, 1.0, n)
    x2 = rng.normal(0.0, 1.0, n)
    color = rng.choice(["red", "green", "blue"], n)
    logit = 2.0 * x1 - 1.5 * x2 + (color == "red") * 1.0
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-logit)), "yes", "no")
    return pa.table({"x1": x1, "x2": x2, "color": color, "label": y})


def write_sites(tmp: Path, n_sites: int, rows: int = 400, fmt: str = "parquet") -> list[Path]:
    paths = []
    for i in range(n_sites):
        t = make_table(rows, seed=100 + i, shift=(i - n_sites / 2) * 0.3)
        p = tmp / f"site{i}.{fmt}"
        if fmt == "csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(t, p)
        else:
            pq.write_table(t, p)
        paths.append(p)
    return paths


def meta(site_ids: list[str], rows: int = 400, name: str = "clinics") -> FederatedDatasetMeta:
    n = rows * len(site_ids)
    return FederatedDatasetMeta(name=name, columns=COLUMNS, unit_column=None, n_rows=n, n_units=n, delta=1e-5,
                                sites=tuple({"site": s, "n_rows": rows} for s in site_ids))


def exact_accuracy(coord, weights) -> float:
    """The model's accuracy on 2,000 fresh rows of the sites' distribution (not a DP release)."""
    from engines.federated import model, site_data

    x, y, _, _ = site_data.prepare(make_table(2000, seed=7), {**coord._job("train", 0)["spec"], "test_fraction": 1e-9})
    return float(np.mean(model.predict([np.asarray(w) for w in weights], x) == y))
