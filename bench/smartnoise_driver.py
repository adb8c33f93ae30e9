"""Run one smartnoise-synth 1.0.8 synthesizer (MST or AIM) on a CSV and write its sample.

Runs in bench/.venv-smartnoise (bench/setup_smartnoise.sh), never in the service's venv:
smartnoise-synth pins mbi 1.x, opacus 0.14 and (through smartnoise-sql) opendp 0.14 and
pandas 2. bench/bench_synthesis.py calls it as a subprocess and computes every metric itself.

    python smartnoise_driver.py --synth mst --epsilon 1 --delta 2e-6 --train train.csv \
        --spec spec.json --rows 49358 --out synthetic.csv --info info.json

``spec.json``: {"columns": {name: {"type": "numeric", "lower", "upper", "bins"} or
{"type": "categorical", "domain": [...]}}} -- the declared (public) schema the service's
engine gets. Each column gets a transformer fitted on that public metadata only, never on
the rows (smartnoise's documented path, ``fit(df, categorical_columns=..., continuous_columns=...)``,
would read every category from the data, and without bounds spend ``preprocessor_eps`` on
estimating them):

* numeric: ``BinTransformer(bins, lower, upper, nullable=True)`` fitted on [lower, upper]
  (it bins the declared range and adds a null flag column; values are clamped); its
  shipped inverse transform returns the bin's *midpoint*;
* categorical: ``LabelTransformer(nullable=True)`` fitted on the declared domain (sorted,
  plus a null category); values outside the domain are read as null, as the engine does.

A TableTransformer whose column transformers are all fitted is used as is (``fit_complete``),
so ``fit`` spends nothing on preprocessing. Note the trap: a BinTransformer only counts as
fitted at construction when ``lower and upper`` are truthy, so a lower bound of 0 would make
the table transformer refit every column on the data -- hence the explicit ``fit`` calls.

Timing: ``fit`` + ``sample`` (imports and reading the CSV excluded), in ``info.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synth", choices=("mst", "aim"), required=True)
    ap.add_argument("--epsilon", type=float, required=True)
    ap.add_argument("--delta", type=float, required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--info", required=True)
    ap.add_argument("--seed", type=int, default=None, help="seed numpy's global generator (smartnoise uses it)")
    ap.add_argument("--aim-rounds", type=int, default=None, help="AIM rounds (default: smartnoise's 16 x columns)")
    ap.add_argument("--aim-max-model-size", type=float, default=80, help="AIM max_model_size in MB (default 80)")
    args = ap.parse_args(argv)

    import numpy as np
    import pandas as pd
    import snsynth.aim  # import mbi 1.x before the clock starts
    import snsynth.mst  # noqa: F401
    from snsynth import Synthesizer, TableTransformer
    from snsynth.transform import BinTransformer, LabelTransformer

    if args.seed is not None:
        np.random.seed(args.seed)
        random.seed(args.seed)

    with open(args.spec) as f:
        spec = json.load(f)["columns"]
    names = list(spec)
    dtypes = {c: (object if s["type"] == "categorical" else "float64") for c, s in spec.items()}
    df = pd.read_csv(args.train, dtype=dtypes, keep_default_na=False, na_values=[""])[names]

    transformers = []
    for c in names:
        s = spec[c]
        if s["type"] == "numeric":
            t = BinTransformer(bins=int(s["bins"]), lower=float(s["lower"]), upper=float(s["upper"]), nullable=True)
            t.fit([float(s["lower"]), float(s["upper"])])
        else:
            domain = [str(v) for v in s["domain"]]
            df[c] = df[c].where(df[c].isin(domain), None)
            t = LabelTransformer(nullable=True)
            t.fit(domain)
        assert t.fit_complete, c
        transformers.append(t)
    df = df.astype(object).where(df.notna(), None)  # None for null in every column
    transformer = TableTransformer(transformers)
    assert transformer.fit_complete and not transformer.needs_epsilon

    kwargs = {}
    if args.synth == "aim":
        kwargs = {"rounds": args.aim_rounds, "max_model_size": args.aim_max_model_size}
    synth = Synthesizer.create(args.synth, epsilon=args.epsilon, delta=args.delta, verbose=False, **kwargs)
    t0 = time.perf_counter()
    synth.fit(df, transformer=transformer, preprocessor_eps=0.0)
    t1 = time.perf_counter()
    out = synth.sample(args.rows)
    t2 = time.perf_counter()
    out = pd.DataFrame(out, columns=names)
    out.to_csv(args.out, index=False)
    info = {"synth": args.synth, "epsilon": args.epsilon, "delta": args.delta, "epsilon_left_after_preprocessing":
            synth.epsilon, "fit_seconds": t1 - t0, "sample_seconds": t2 - t1, "seconds": t2 - t0,
            "rows": len(out), "output_columns": transformer.output_width,
            "cardinality": [int(c) for c in transformer.cardinality], "pid": os.getpid(),
            "python": sys.version.split()[0]}
    info["cliques"] = [list(c) for c in synth.synthesizer.cliques]
    with open(args.info, "w") as f:
        json.dump(info, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
