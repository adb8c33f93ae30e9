"""The officer report's raw-value discriminator against an independent recomputation.

For each table (``bench_synthesis_tables.py``'s keys) one MST table at epsilon 1, then on the
same real and synthetic rows: the report's ``_discriminator`` as it is (early stopping only
past 10,000 rows, scikit-learn's default), as it was before 70a34c8 (early stopping from
500 rows), and ``bench_synthesis_tables.discriminator`` (a plain HistGradientBoostingClassifier
under ``cross_val_predict``, the rows shuffled). Prints the three AUCs and the gaps.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_report_discriminator.py --tables housing,affairs,wage,loans,cps
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_synthesis_tables as tables  # noqa: E402  (sets up the repository's path)

from engines.synthesis import report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", default="housing,affairs,wage,loans,cps")
    args = ap.parse_args()
    fit = report._fit_classifier

    def stopped_from_500_rows(X, y, categorical, seed, early=None):
        return fit(X, y, categorical, seed)  # early stopping decided as for the models

    for key in args.tables.split(","):
        train, holdout, schema, unit, cols, _ = tables.load(key)
        synthetic, _ = tables.run_engine(train, schema, unit, 1.0, "mst")
        sch = {c: dict(schema[c]) for c in cols}
        n = min(len(train), len(synthetic), report.DISCRIMINATOR_ROWS, len(holdout))
        real = report._sample(train[cols], n, report._rng(0, 3))
        fake = report._sample(synthetic[cols], n, report._rng(0, 4))
        now = report._discriminator(real, fake, sch, cols, 0)
        report._fit_classifier = stopped_from_500_rows
        try:
            before = report._discriminator(real, fake, sch, cols, 0)
        finally:
            report._fit_classifier = fit
        coders = tables._codes(train, cols, schema, 10)
        # its folds are not shuffled: the rows in a random order (the report's samples keep the table's)
        indep = tables.discriminator(real.sample(frac=1, random_state=1), fake.sample(frac=1, random_state=2), cols,
                                     schema, coders, raw=True)
        print(f"{key:8s} rows/class {n:6d}  report before {before:.3f}  report now {now:.3f}  independent {indep:.3f}"
              f"  |before - independent| {abs(before - indep):.3f}  |now - independent| {abs(now - indep):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
