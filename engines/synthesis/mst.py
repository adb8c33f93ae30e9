"""MST (McKenna, Miklau & Sheldon 2021) on top of ``mbi`` (private-pgm): measure, select,
estimate a graphical model, sample. The measurements use only the noise the plan paid
for: OpenDP's discrete Gaussian for marginal counts and OpenDP's report-noisy-max for
the selections (see planner.py for the accounting).

Domain compression as in the reference MST (McKenna's mst.py ``compress_domain``), from
the noisy one-way counts only: a categorical column's rare values (noisy count below 3
sigma) become one cell; a numeric column is measured as a tree of histograms, partitioned
top-down where the noisy counts allow (``measure_one_way``), and its partition cells
merged left to right into private quantile bins (``compress``). The model works on the
compressed cells; sampled rows go back to measured cells in proportion to their noisy
counts (and the heavy grid values' counts, ``encoding.heavy_leaf_mass``).

Sampling is mbi 2.0's ``synthetic_data`` (randomised rounding along the junction tree),
which shuffles rows within each parent group before filling a child column: the fix of
the trap in mbi 1.x / smartnoise-synth 1.0.8, where columns sharing a parent were filled
in row order and became falsely correlated.
"""

from __future__ import annotations

import itertools
import math
import os

import numpy as np

from engines.aggregates.noise import Noise, noisy_max

from . import encoding


def _mbi():
    import jax

    jax.config.update("jax_enable_x64", True)  # mbi's estimators stall in float32 on large tables
    jax.config.update("jax_enable_compilation_cache", False)  # mbi compiles many small programs (its advice)
    import mbi
    from mbi.estimation import MirrorDescent

    return mbi, MirrorDescent


def noise_l1(sd: float) -> float:
    """The expected absolute value of a Gaussian of sd ``sd``: per cell, the L1 error a
    measurement at that noise adds (AIM's selection discounts a candidate's error by it
    times its cells; so does MST's here, a public amount since the cells come from the
    private compression)."""
    return math.sqrt(2 / math.pi) * sd


def shrink(y: np.ndarray, sd: float, groups: np.ndarray | None = None, width: np.ndarray | None = None) -> np.ndarray:
    """Sampling weights of cells from their noisy counts ``y`` (noise sd ``sd`` each),
    each group of cells (``groups``: a group index per cell; default one group) on its
    own: the counts shrunk toward an even spread of the group's sum (in proportion to
    ``width``, each cell's measured cells) by the share of their spread that the noise
    does not explain, then clipped at 0. An empirical-Bayes estimate without a tuning
    constant (method of moments: m counts spread around their mean by (m - 1) sd^2 on
    average from the noise alone; James-Stein's estimator with its positive part): cells
    whose counts differ by no more than noise are drawn evenly, cells that differ by much
    more by their counts. Post-processing. Measured in bench/README.md ("cells drawn by
    shrunk counts"): clipped counts drew a smooth column as random spikes of noise, the
    soft threshold max(y - sd, 0) left most of its cells empty."""
    y = np.asarray(y, dtype=float)
    if not len(y):
        return y
    g = np.zeros(len(y), dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    width = np.ones(len(y)) if width is None else np.asarray(width, dtype=float)
    n = int(g.max()) + 1

    def total(x):
        return np.bincount(g, weights=np.asarray(x, dtype=float), minlength=n)

    m = total(np.ones(len(y)))
    with np.errstate(divide="ignore", invalid="ignore"):  # groups with no cell
        even = width * (total(y) / total(width))[g]
        spread = total((y - even) ** 2)
        keep = np.where(spread > 0, np.clip(1.0 - (m - 1) * sd ** 2 / spread, 0.0, 1.0), 0.0)
    keep[m < 2] = 1.0
    return np.clip(even + keep[g] * (y - even), 0, None)


def _noisy_max(scores: np.ndarray, scale: float) -> int:
    return int(noisy_max(scale)([float(s) for s in scores]))


class _Components:
    def __init__(self, items):
        self.parent = {i: i for i in items}

    def find(self, i):
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a, b):
        self.parent[self.find(a)] = self.find(b)


class PairCounts:
    """A two-way marginal's exact counts, kept sparse: ``index`` (the nonzero cells' flat
    indices a * size_b + b, sorted and unique) and ``count``. A pair of two continuous
    columns of 16,384 measured cells each has 268 million cells (2 GiB as a dense
    array) and at most one nonzero per row. Additive over disjoint parts of a table
    (``+``; ``0 + x`` is ``x``, so ``sum`` works)."""

    __slots__ = ("index", "count")

    def __init__(self, index: np.ndarray, count: np.ndarray):
        self.index, self.count = index, count

    @classmethod
    def of(cls, flat: np.ndarray) -> "PairCounts":
        index, count = np.unique(np.asarray(flat, dtype=np.int64), return_counts=True)
        return cls(index, count.astype(np.int64))

    def __add__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        index, inverse = np.unique(np.concatenate([self.index, other.index]), return_inverse=True)
        count = np.bincount(inverse, weights=np.concatenate([self.count, other.count]), minlength=len(index))
        return PairCounts(index, np.rint(count).astype(np.int64))

    __radd__ = __add__

    def __eq__(self, other):
        return isinstance(other, PairCounts) and np.array_equal(self.index, other.index) \
            and np.array_equal(self.count, other.count)

    def __reduce__(self):
        return PairCounts, (self.index, self.count)


def marginal_counts(codes: dict[str, np.ndarray], sizes: dict[str, int]) -> dict:
    """The exact counts MST measures or scores: every column's one-way marginal and every
    pair's two-way marginal (``PairCounts``) (group-by counts, additive over disjoint parts
    of a table: a distributed run sums them over partitions, engines/distributed/synthesis.py)."""
    cols = list(codes)
    return {"one": {c: np.bincount(codes[c], minlength=sizes[c]) for c in cols},
            "two": {(a, b): PairCounts.of(codes[a].astype(np.int64) * sizes[b] + codes[b])
                    for a, b in itertools.combinations(cols, 2)}}


def synthesize(codes: dict[str, np.ndarray], columns: list[dict], details: dict, rows: int, progress,
               iters: int = 1000, heavy: dict | None = None,
               reweight: tuple[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], dict, dict]:
    """Cells of ``rows`` synthetic rows (``encoding.cell_encode``), what the run released
    (the selected pairs) and each column's noisy one-way cell counts (for decoding).
    ``reweight``: (column, weight of each of its cells), see ``sample``."""
    sizes = {c["column"]: encoding.cell_size(c) for c in columns}
    return synthesize_from_counts(marginal_counts(codes, sizes), columns, details, rows, progress, iters, heavy,
                                  reweight)


SPLIT = 8.0  # a tree node is split into its children when its noisy count reaches SPLIT noise sds


def measure_one_way(exact: np.ndarray, col: dict, noise: Noise) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each measured cell's partition cell, each partition cell's noisy count, each
    measured cell's own noisy count: the tree's last level). A flat
    column: its cells, one noisy histogram. A tree column (``encoding.tree_blocks``): one
    noisy histogram per level (blocks of 4^j consecutive cells; the null cell with the
    last level), then, as post-processing, a partition from the top: a block whose noisy
    count reaches SPLIT sds is replaced by its 4 children, else it is a partition cell
    (with its noisy count): fine cells where the rows are, wide ones where they are not."""
    blocks = encoding.tree_blocks(col)
    if blocks == [1]:
        y = np.asarray(noise.release(exact), dtype=float)
        return np.arange(len(exact)), y, y
    nv = encoding.n_values(col)
    exact = np.asarray(exact)
    values, null = exact[:nv], exact[nv:]
    levels = []
    for b in blocks:
        agg = np.add.reduceat(values, np.arange(0, nv, b))
        if b == 1:
            agg = np.append(agg, null)
        levels.append(np.asarray(noise.release(agg.astype(np.int64)), dtype=float))
    parts: list[tuple[int, int, float]] = []
    theta = SPLIT * noise.scale

    def visit(level: int, i: int):
        b = blocks[level]
        start = i * b
        if start >= nv:
            return
        y = levels[level][i]
        if level == len(blocks) - 1 or y < theta:
            parts.append((start, min(start + b, nv), y))
        else:
            for child in range(4 * i, 4 * i + 4):
                visit(level + 1, child)

    for i in range(len(levels[0]) if len(blocks) else 0):
        visit(0, i)
    cellmap = np.zeros(len(exact), dtype=np.int64)
    counts = []
    for j, (a, z, y) in enumerate(parts):
        cellmap[a:z] = j
        counts.append(y)
    if len(null):
        cellmap[nv] = len(parts)
        counts.append(levels[-1][nv])
    return cellmap, np.array(counts, dtype=float), levels[-1]


def compress(y: np.ndarray, sigma: float, col: dict, nv: int | None = None) -> np.ndarray:
    """The compressed cell of each partition cell, from their noisy counts ``y`` only
    (post-processing), as in the reference MST's ``compress_domain``: a categorical
    column's values whose noisy count is below 3 sigma (with the null cell) become one
    cell; a numeric column's adjacent cells are merged left to right until each group
    holds at least max(3 sigma, total / bins) of soft-thresholded mass (max(y - sigma, 0):
    empty cells add next to nothing), so groups are private quantile bins and a value
    that alone carries that much keeps a cell of its own. A flat numeric column (measured
    on its own grid values, at most ``encoding.TREE_MIN``) keeps, as a categorical one, every
    value whose noisy count clears 3 sigma as a cell of its own (a code 4 of 0-6 held by 4%
    of the rows may decide another column: merged with 3 it could not), and merges only
    the runs of rarer values between them. Its null cell stays apart when
    its noisy count clears 3 sigma, else it joins the largest cell's group (and is drawn
    there with its soft-thresholded weight, usually 0: ``_within``). ``nv``: the cells of
    values (the rest is the null cell)."""
    nv = encoding.n_values(col) if nv is None else nv
    n = len(y)
    mapping = np.zeros(n, dtype=np.int64)
    if col["type"] == "categorical":
        keep = y[:nv] >= 3 * sigma
        mapping[:nv] = np.where(keep, np.cumsum(keep) - 1, keep.sum())
        if n > nv:  # null (or a value outside the domain) goes with the rare values
            mapping[nv] = keep.sum()
            if y[nv] < 3 * sigma and keep.all():  # no rare value: with the largest cell (drawn with weight ~0)
                mapping[nv] = mapping[int(np.argmax(y[:nv]))]
        return _dense(mapping)
    w = np.clip(y[:nv] - sigma, 0, None)
    target = max(3 * sigma, float(np.clip(y, 0, None).sum()) / col.get("bins", 20))
    own = y[:nv] >= 3 * sigma if encoding.tree_blocks(col) == [1] else np.zeros(nv, dtype=bool)
    group, acc, members = 0, 0.0, 0
    for i in range(nv):
        if own[i]:  # a grid value of a flat column that clears 3 sigma: a cell of its own
            group += 1 if members else 0
            mapping[i] = group
            group, acc, members = group + 1, 0.0, 0
            continue
        mapping[i] = group
        acc += w[i]
        members += 1
        if acc >= target:
            group, acc, members = group + 1, 0.0, 0
    if group > 0 and members and acc < target:  # a short last group joins the one before
        mapping[:nv][mapping[:nv] == group] = group - 1
    if n > nv:
        mapping[nv] = mapping[:nv].max() + 1 if y[nv] >= 3 * sigma else mapping[int(np.argmax(y[:nv]))]
    return _dense(mapping)


def _dense(mapping: np.ndarray) -> np.ndarray:
    return np.unique(mapping, return_inverse=True)[1].astype(np.int64)


def _within(y: np.ndarray, sigma: float, mapping: np.ndarray, nv: int,
            width: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each compressed cell: its partition cells and their sampling probabilities.
    ``width`` (each partition cell's measured cells: 1 for a category, 4^j for a block of
    a tree column): the values' cells weigh their noisy counts shrunk toward an even
    spread (``shrink``); a group of rare categories is often many of similar, small counts
    (131 local authorities of Chem97), whose differences are mostly noise, and a tree
    column's cells are pieces of one range. Without ``width`` (a numeric column's own grid
    values, often coded with gaps: 0, 1, 2, 3, 7, 12) their noisy counts clipped at 0, so
    a value that is not there stays away half the time. The null cell (index ``nv`` and
    on), which joins a group only when its noisy count is under 3 sigma, weighs its count
    soft-thresholded (max(y - sigma, 0): a column without nulls gets next to none). When
    all weigh 0: the clipped counts, else evenly."""
    weight = np.clip(np.asarray(y, dtype=float) - sigma, 0, None)  # the null cell's
    weight[:nv] = np.clip(y[:nv], 0, None) if width is None else shrink(y[:nv], sigma, mapping[:nv], width[:nv])
    out = []
    for g in range(int(mapping.max()) + 1):
        cells = np.flatnonzero(mapping == g)
        for w in (weight[cells], np.clip(y[cells], 0, None), np.ones(len(cells))):
            if w.sum() > 0:
                out.append((cells, w / w.sum()))
                break
    return out


def _compressed_pair(exact: PairCounts, ma: np.ndarray, mb: np.ndarray) -> np.ndarray:
    """A pair's exact counts on the model cells: measured cells (a, b) = divmod(index,
    measured cells of b), mapped by each column's measured cell -> model cell map."""
    ca, cb = int(ma.max()) + 1, int(mb.max()) + 1
    ia, ib = np.divmod(exact.index, len(mb))
    return np.bincount(ma[ia] * cb + mb[ib], weights=exact.count.astype(float), minlength=ca * cb)


def noisy_total(ys: list[np.ndarray]) -> float:
    """The table's size from its columns' noisy one-way counts (each cell's noise of one
    sd, each row in one cell of every column, its null cell included): each column's plain
    sum is unbiased with variance growing with its cells, so the sums are weighed by the
    inverse of their cells. Clipped at 0 first, as it was, every empty cell of a large
    declared domain added about 0.4 sd: a probe's 3,000 rows with 20,000 declared values
    in one column were taken for 40,787, and 61% of MST's synthetic rows came out on values
    no real row holds."""
    weights = np.array([1.0 / max(len(y), 1) for y in ys])
    sums = np.array([float(np.sum(y)) for y in ys])
    return max(float((weights * sums).sum() / weights.sum()), 1.0)


class OneWay:
    """Every column's one-way measurement and its private compression (``measure_columns``):
    ``cellmap`` (measured cell -> partition cell), ``ycell`` / ``yleaf`` (noisy counts of
    the partition cells / of the measured cells), ``maps`` (partition cell -> model cell),
    ``nv`` (partition cells of values; a null cell after them), ``leafmap`` (measured
    cell -> model cell), ``csize`` (model cells), ``prob`` (each
    column's noisy model-cell distribution), ``total`` (the noisy table size) and
    ``measurements`` (mbi's, on the model cells)."""

    def __init__(self, counts: dict, columns: list[dict], one: Noise, mbi):
        spec = {c["column"]: c for c in columns}
        self.cols = list(counts["one"])
        self.cellmap, self.ycell, self.yleaf, self.maps, self.nv, self.measurements = {}, {}, {}, {}, {}, []
        for c in self.cols:
            self.cellmap[c], self.ycell[c], self.yleaf[c] = measure_one_way(counts["one"][c], spec[c], one)
            self.nv[c] = nv = int(self.cellmap[c][:encoding.n_values(spec[c])].max()) + 1
            self.maps[c] = compress(self.ycell[c], one.scale, spec[c], nv)
            self.measurements.append(mbi.LinearMeasurement(self.ycell[c], (c,), stddev=one.scale).compress(
                {c: self.maps[c]}, mbi.Domain([c], [len(self.ycell[c])])))
        self.leafmap = {c: self.maps[c][self.cellmap[c]] for c in self.cols}
        self.csize = {c: int(self.maps[c].max()) + 1 for c in self.cols}
        self.total = noisy_total(list(self.ycell.values()))
        self.prob = {}
        for c in self.cols:
            y = np.clip(np.bincount(self.maps[c], weights=self.ycell[c], minlength=self.csize[c]), 0, None)
            self.prob[c] = y / max(y.sum(), 1e-12)
        self.scale = one.scale
        self.flat_numeric = {c: spec[c]["type"] == "numeric" and encoding.tree_blocks(spec[c]) == [1]
                             for c in self.cols}

    def widths(self, c: str) -> np.ndarray | None:
        """Each partition cell's measured cells (``_within``'s ``width``: 1 for a
        category, 4^j for a block of a tree column); None for a numeric column measured on
        its own grid values (one histogram, no tree), whose values are drawn by their
        clipped counts."""
        if self.flat_numeric[c]:
            return None
        return np.bincount(self.cellmap[c], minlength=len(self.ycell[c]))

    def domain(self, mbi):
        return mbi.Domain(self.cols, [self.csize[c] for c in self.cols])

    def pair(self, counts: dict, a: str, b: str) -> np.ndarray:
        """The exact two-way counts of (a, b) on the model cells (a before b in ``cols``)."""
        return _compressed_pair(counts["two"][a, b], self.leafmap[a], self.leafmap[b])

    def single(self, counts: dict, c: str) -> np.ndarray:
        """The exact one-way counts of c on the model cells."""
        return np.bincount(self.leafmap[c], weights=np.asarray(counts["one"][c], dtype=float),
                           minlength=self.csize[c])


def pair_scores(exact: dict, ow: OneWay, sd: float) -> dict:
    """Each pair's selection score from its exact counts on the model cells: the L1 error
    of the independence model (the noisy one-way shares times the noisy total), less the
    L1 its measurement at noise ``sd`` is expected to add (``noise_l1`` per cell, as AIM's
    selection). On a small table a pair of many cells would be measured as mostly noise,
    and the model fitted to it would be further from the real pairs than independence;
    the discount prefers pairs the budget can measure. Sensitivity: the error's (k per
    unit); the discount is public."""
    bias = noise_l1(sd)
    return {(a, b): float(np.abs(y - np.outer(ow.prob[a], ow.prob[b]).ravel() * ow.total).sum())
            - bias * ow.csize[a] * ow.csize[b] for (a, b), y in exact.items()}


def synthesize_from_counts(counts: dict, columns: list[dict], details: dict, rows: int, progress,
                           iters: int = 1000, heavy: dict | None = None,
                           reweight: tuple[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], dict, dict]:
    """MST from the exact marginals (``marginal_counts`` of the cells): noise, private
    compression of each column's cells, selection, fit, sample, and back to cells
    (``to_cells``). Returns the cells, what was released (pairs) and each measured cell's
    weight (for decoding)."""
    mbi, MirrorDescent = _mbi()
    one, two = Noise.from_dict(details["one_way"]), Noise.from_dict(details["two_way"])

    progress({"phase": "measuring one-way marginals", "fraction": 0.05, "marginals_measured": 0})
    ow = OneWay(counts, columns, one, mbi)
    cols, measurements = ow.cols, list(ow.measurements)

    progress({"phase": "selecting pairs", "fraction": 0.15, "marginals_measured": len(cols)})
    pairs = list(itertools.combinations(cols, 2))
    exact = {(a, b): ow.pair(counts, a, b) for a, b in pairs}
    score = pair_scores(exact, ow, two.scale)
    comps, tree = _Components(cols), []
    for _ in range(len(cols) - 1):
        candidates = [p for p in pairs if comps.find(p[0]) != comps.find(p[1])]
        a, b = candidates[_noisy_max(np.array([score[p] for p in candidates]), details["select_scale"])]
        comps.union(a, b)
        tree.append((a, b))

    for i, (a, b) in enumerate(tree):
        progress({"phase": "measuring two-way marginals", "fraction": round(0.2 + 0.2 * i / len(tree), 4),
                  "marginals_measured": len(cols) + i})
        y = np.asarray(two.release(np.rint(exact[a, b]).astype(np.int64)), dtype=float)
        measurements.append(mbi.LinearMeasurement(y, (a, b), stddev=two.scale))

    progress({"phase": "fitting the graphical model", "fraction": 0.45, "marginals_measured": len(measurements)})
    model = MirrorDescent().estimate(ow.domain(mbi), measurements, known_total=ow.total, iters=iters)
    progress({"phase": "sampling", "fraction": 0.8, "marginals_measured": len(measurements)})
    out, noisy = sample(model, rows, ow, heavy, reweight)
    info = {"selected_pairs": [list(p) for p in tree], "model_cells": dict(ow.csize)}
    return out, info, noisy


def sample(model, rows: int, ow: "OneWay", heavy: dict | None = None,
           reweight: tuple[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """``rows`` rows of the fitted model, as measured cells (``to_cells``). ``reweight``
    (column, weight of each of its measured cells): the rows are drawn from the model
    tilted by that weight (``tilt``), so a row's probability is the model's times the
    weight of its cell of that column; the column itself is dropped. Post-processing of
    the model only."""
    if reweight is not None:
        model = tilt(model, ow, *reweight)
    out, noisy = to_cells(model.synthetic_data(rows).to_dict(), ow, heavy)
    if reweight is not None:
        out.pop(reweight[0])
    return out, noisy


def tilt(model, ow: "OneWay", column: str, weight: np.ndarray):
    """The model with its distribution multiplied by ``weight`` (one per measured cell of
    ``column``) and renormalised: log(weight) added to the log-potential of one clique
    holding the column. A model cell stands for several measured cells when compression
    merged them (their noisy counts all under 3 sd); its weight is theirs averaged as
    ``to_cells`` draws them (``_within``), at most the largest weight of a cell whose count
    cleared 3 sd: a merged cell's share in the model is mostly noise, which a large
    weight would multiply."""
    import jax.numpy as jnp
    from mbi import CliqueVector, Domain, Factor

    weight = np.asarray(weight, dtype=float)
    y = ow.ycell[column]
    strong = y[:len(weight)] >= 3 * ow.scale
    cap = float(weight[strong].max()) if strong.any() else 1.0
    w = np.zeros(ow.csize[column])
    for g, (cells, p) in enumerate(_within(y, ow.scale, ow.maps[column], ow.nv[column], ow.widths(column))):
        w[g] = min(float(np.dot(p, weight[cells])), cap)
    pots = model.potentials
    clique = next(cl for cl in pots.cliques if column in cl)
    tables = dict(pots.tables)
    tables[clique] = tables[clique] + Factor(Domain([column], [len(w)]), jnp.log(jnp.asarray(w)))
    return model.replace(potentials=CliqueVector(pots.domain, pots.cliques, tables))


def to_cells(data: dict, ow: OneWay, heavy: dict | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Sampled model cells back to measured cells (post-processing of the one-way counts):
    a model cell's rows go to its partition cells (``_within``), a partition cell's rows
    to its measured cells by their own noisy counts (the tree's last level) shrunk toward
    an even spread (``shrink``: evenly where they differ by no more than noise; evenly
    too when they are all 0).
    ``heavy``: per measured cell of a column, the noisy mass of its heavy grid values
    (``encoding.heavy_leaf_mass``): a partition cell's rows go to its measured cells in
    proportion to that mass plus an even share of the rest of the cell's count. Returns
    the cells and each measured cell's weight (for decoding)."""
    rng = np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
    out, noisy = {}, {}
    for c in ow.cols:
        z = np.asarray(data[c], dtype=np.int64)
        cellmap, ycell, yleaf = ow.cellmap[c], ow.ycell[c], ow.yleaf[c]
        part = np.zeros(len(z), dtype=np.int64)
        for g, (members, p) in enumerate(_within(ycell, ow.scale, ow.maps[c], ow.nv[c], ow.widths(c))):
            rows_g = np.flatnonzero(z == g)
            part[rows_g] = members[rng.choice(len(members), size=len(rows_g), p=p)]
        own = shrink(yleaf, ow.scale, cellmap)
        own_sum = np.bincount(cellmap, weights=own, minlength=len(ycell))
        width = np.bincount(cellmap, minlength=len(ycell))
        frac = np.where(own_sum[cellmap] > 0, own / np.maximum(own_sum[cellmap], 1e-12), 1.0 / width[cellmap])
        weight = np.clip(ycell, 0, None)[cellmap] * frac
        if heavy and c in heavy:
            h = np.asarray(heavy[c], dtype=float)
            in_part = np.bincount(cellmap, weights=h, minlength=len(ycell))
            rest = np.clip(np.clip(ycell, 0, None) - in_part, 0, None)
            weight = h + rest[cellmap] * frac
        cells = np.zeros(len(z), dtype=np.int64)
        for j in np.unique(part):  # a measured cell of the partition cell
            rows_j = np.flatnonzero(part == j)
            members = np.flatnonzero(cellmap == j)
            w = weight[members]
            p = w / w.sum() if w.sum() > 0 else np.full(len(members), 1.0 / len(members))
            cells[rows_j] = members[rng.choice(len(members), size=len(rows_j), p=p)]
        out[c] = cells
        noisy[c] = weight
    return out, noisy


def fine_counts(fine_codes: dict[str, np.ndarray], sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Each numeric column's exact fine histogram (additive over partitions)."""
    return {c: np.bincount(x, minlength=sizes[c]) for c, x in fine_codes.items()}


def measure_fine(fine_codes: dict[str, np.ndarray], sizes: dict[str, int], details: dict) -> dict[str, np.ndarray]:
    """Each numeric column's noisy fine histogram (the plan's ``fine`` measurements)."""
    return measure_fine_counts(fine_counts(fine_codes, sizes), details)


def measure_fine_counts(counts: dict[str, np.ndarray], details: dict) -> dict[str, np.ndarray]:
    if not counts:
        return {}
    noise = Noise.from_dict(details["fine"])
    return {c: np.asarray(noise.release(x), dtype=float) for c, x in counts.items()}
