#!/usr/bin/env python3
"""The excess-spectrum fits of docs/analysis-rules.md R22 (issue 14), from a block-width results folder.

    python3 scripts/excess_spectrum.py results/block-width-r22 [--seeds 9,10,11] [--boot 2000]

Per RoPE run (status done): the layer spectra p̄_l = mean over heads of `energy_frac` at the step-0 and the
final evaluation (`spectrum.parquet`); the excess e_l = max(p̄_l^final − p̄_l^init, 0), renormalised; its
log-mean θ_excess,l = exp(Σ e_i ln θ_i). Pooling `positional-excess` takes the run's positional layer
(`positional_layer` in `runs.parquet`, rule R2); `layer:<l>-excess` every layer; `positional` (θ_eff of
p̄_{l*}^final, R1) is recomputed beside them and checked against the lab's `effective_freq_positional`.

Fit: ln θ = ln c − β ln B by least squares over runs; 95 % percentile bootstrap over seeds (resample the seeds
with replacement, every run of a drawn seed enters once per draw; `random.Random(0)`).
"""
import argparse
import math
import random
import sys
from collections import defaultdict

import polars as pl


def fit(points):
    """Least squares of ln θ on ln B: (β, c, R²) for points [(B, θ)]."""
    xs = [math.log(b) for b, _ in points]
    ys = [math.log(t) for _, t in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    a = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (a + slope * x)) ** 2 for x, y in zip(xs, ys))
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    return -slope, math.exp(a), r2


def boot(by_seed, reps):
    rng = random.Random(0)
    seeds = sorted(by_seed)
    betas, cs = [], []
    for _ in range(reps):
        pts = [p for s in (rng.choice(seeds) for _ in seeds) for p in by_seed[s]]
        if len({b for b, _ in pts}) < 2:
            continue
        b, c, _ = fit(pts)
        betas.append(b)
        cs.append(c)
    q = lambda v, p: sorted(v)[min(len(v) - 1, max(0, int(round(p * (len(v) - 1)))))]
    return (q(betas, 0.025), q(betas, 0.975)), (q(cs, 0.025), q(cs, 0.975))


def log_mean(p, theta):
    return math.exp(sum(pi * math.log(t) for pi, t in zip(p, theta)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--seeds", help="only these seeds, e.g. 9,10,11")
    ap.add_argument("--boot", type=int, default=2000)
    args = ap.parse_args()
    runs = pl.read_parquet(f"{args.results}/runs.parquet").filter(
        (pl.col("encoding") == "rope") & (pl.col("status") == "done"))
    if args.seeds:
        runs = runs.filter(pl.col("seed").is_in([int(s) for s in args.seeds.split(",")]))
    if runs.height == 0:
        sys.exit("no finished RoPE runs")
    spec = pl.read_parquet(f"{args.results}/spectrum.parquet").filter(
        pl.col("run_id").is_in(runs["run_id"].to_list()))
    layer_spec = (spec.group_by(["run_id", "step", "layer", "freq_index"])
                  .agg(pl.col("energy_frac").mean(), pl.col("theta").first())
                  .sort(["run_id", "step", "layer", "freq_index"]))
    spectra = defaultdict(dict)  # run -> step -> layer -> (p, theta)
    for (rid, step, layer), g in layer_spec.group_by(["run_id", "step", "layer"], maintain_order=True):
        spectra[rid].setdefault(step, {})[layer] = (g["energy_frac"].to_list(), g["theta"].to_list())

    points = defaultdict(lambda: defaultdict(list))  # (variant, pooling) -> seed -> [(B, θ)]
    left_out = defaultdict(int)
    worst = 0.0
    for r in runs.iter_rows(named=True):
        steps = spectra[r["run_id"]]
        init, final = steps[min(steps)], steps[max(steps)]
        lstar = r["positional_layer"]
        for layer in sorted(final):
            p1, theta = final[layer]
            p0, _ = init[layer]
            ex = [max(a - b, 0.0) for a, b in zip(p1, p0)]
            tot = sum(ex)
            key = (r["variant"], r["seed"])
            if layer == lstar:
                th = log_mean(p1, theta)
                worst = max(worst, abs(th / r["effective_freq_positional"] - 1))
                points[(r["variant"], "positional")][r["seed"]].append((r["block_len"], th))
            if tot <= 0:
                left_out[(r["variant"], f"layer:{layer}-excess")] += 1
                if layer == lstar:
                    left_out[(r["variant"], "positional-excess")] += 1
                continue
            th_ex = log_mean([e / tot for e in ex], theta)
            points[(r["variant"], f"layer:{layer}-excess")][r["seed"]].append((r["block_len"], th_ex))
            if layer == lstar:
                points[(r["variant"], "positional-excess")][r["seed"]].append((r["block_len"], th_ex))
    seeds = sorted(runs["seed"].unique().to_list())
    print(f"{args.results}: {runs.height} RoPE runs, seeds {seeds}; positional θ_eff recomputed within "
          f"{worst:.1e} (relative) of the lab's effective_freq_positional")
    order = {"positional-excess": 0, "positional": 1}
    for key in sorted(points, key=lambda k: (k[0], order.get(k[1], 2), k[1])):
        by_seed = points[key]
        pts = [p for v in by_seed.values() for p in v]
        b, c, r2 = fit(pts)
        (blo, bhi), (clo, chi) = boot(by_seed, args.boot)
        verdict = ""
        if key[1] == "positional-excess":
            verdict = "  meets β ∈ [0.8, 1.2], R² ≥ 0.8" if 0.8 <= b <= 1.2 and r2 >= 0.8 else "  does not meet β ∈ [0.8, 1.2], R² ≥ 0.8"
        lo = left_out.get(key, 0)
        print(f"  rope/{key[0]:<7} {key[1]:<18} β = {b:.3f} [{blo:.3f}, {bhi:.3f}]  c = {c:.3f} [{clo:.3f}, {chi:.3f}]"
              f"  R² = {r2:.3f}  (n = {len(pts)}, {len(by_seed)} seeds{f', {lo} left out' if lo else ''}){verdict}")
    # θ per B (mean over seeds) of the positional-excess pooling.
    for variant in sorted({k[0] for k in points}):
        cells = defaultdict(list)
        for s, pts in points[(variant, "positional-excess")].items():
            for b, t in pts:
                cells[b].append(t)
        line = ", ".join(f"B={b}: {sum(v) / len(v):.4f}" for b, v in sorted(cells.items()))
        print(f"  {variant} positional-excess θ per B (mean over seeds; π/B: "
              + ", ".join(f"{math.pi / b:.4f}" for b in sorted(cells)) + f"): {line}")


if __name__ == "__main__":
    main()
