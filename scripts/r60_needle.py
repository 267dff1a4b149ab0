"""Read docs/analysis-rules.md R60's needle verdicts V1-V3 from a length-extrapolation folder (issue 52, item 6).

  python3 scripts/r60_needle.py results/length-extrapolation

Uses evals.parquet (eval_name "needle": value NLL `loss` and `accuracy` per run, scaling and length factor) of the
runs R58's selection kept (runs.parquet `selected`, when the folder selects). Prints, per encoding and scaling, the
mean value NLL and accuracy over seeds at each length factor, then:
  V1  PoPE - RoPE value NLL at 1x, paired over seeds, 95 % t interval: below 0 holds, covers 0 within noise.
  V2  PoPE's mean value NLL at 8x the highest of RoPE none / linear / yarn, PoPE, TAPA, and PoPE - RoPE (none) at 8x
      with an interval above 0: holds.
  V3  TAPA's mean ratio of 8x to 1x value NLL the smallest of RoPE (none), PoPE, TAPA: holds.
"""

import math
import sys

import polars as pl

# Student's t 0.975 quantiles by degrees of freedom (1..10).
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


def interval(diffs):
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = T975[min(n - 2, len(T975) - 1)] * sd / math.sqrt(n)
    return mean, (mean - half, mean + half)


def word(iv, below_holds=True):
    if iv is None:
        return "one seed: no interval"
    lo, hi = iv
    if lo <= 0 <= hi:
        return "within noise"
    return "holds" if (hi < 0) == below_holds else "reversed"


def main(folder):
    runs = pl.read_parquet(f"{folder}/runs.parquet").filter(pl.col("status") == "done")
    if "selected" in runs.columns and runs["selected"].any():
        runs = runs.filter(pl.col("selected"))
    ev = pl.read_parquet(f"{folder}/evals.parquet").filter(pl.col("eval_name") == "needle")
    ev = ev.join(runs.select(["run_id", "lr"]), on="run_id")
    ev = ev.with_columns(pl.when(pl.col("encoding") == "rope").then(pl.lit("rope+") + pl.col("scaling"))
                         .otherwise(pl.col("encoding")).alias("arm"))
    ev = ev.filter((pl.col("encoding") == "rope") | (pl.col("scaling") == "none"))
    table = ev.group_by(["arm", "factor"]).agg(pl.col("loss").mean().alias("nll"), pl.col("accuracy").mean().alias("acc"),
                                                pl.col("seed").n_unique().alias("seeds"), pl.col("lr").first()).sort(["arm", "factor"])
    print(f"mean over seeds (value NLL nats, accuracy) per arm and length factor; {runs.height} runs")
    for arm in table["arm"].unique().sort():
        t = table.filter(pl.col("arm") == arm)
        cells = "  ".join(f"{f:g}x {n:.3f} / {100 * a:.0f} %" for f, n, a in zip(t["factor"], t["nll"], t["acc"]))
        print(f"  {arm:12s} lr {t['lr'][0]:<7g} seeds {t['seeds'][0]}: {cells}")

    def per_seed(arm, factor):
        r = ev.filter((pl.col("arm") == arm) & (pl.col("factor") == factor))
        return dict(zip(r["seed"], r["loss"]))

    for factor, name in [(1, "V1"), (8, "V2")]:
        p, r = per_seed("pope", factor), per_seed("rope+none", factor)
        seeds = sorted(set(p) & set(r))
        mean, iv = interval([p[s] - r[s] for s in seeds])
        ivs = "no interval" if iv is None else f"[{iv[0]:+.3f}, {iv[1]:+.3f}]"
        if name == "V1":
            print(f"V1 PoPE - RoPE value NLL at 1x: {mean:+.3f} {ivs} over {len(seeds)} seeds -> {word(iv, True)}")
        else:
            at8 = table.filter(pl.col("factor") == 8).sort("nll", descending=True)
            worst = at8["arm"][0]
            above = iv is not None and iv[0] > 0
            v = "holds" if worst == "pope" and above else ("within noise" if iv is not None and iv[0] <= 0 <= iv[1] else "does not hold")
            print(f"V2 PoPE - RoPE (none) value NLL at 8x: {mean:+.3f} {ivs}; the worst at 8x: {worst} -> {v}")
    ratios = {}
    for arm in ["rope+none", "pope", "tapa"]:
        one, eight = per_seed(arm, 1), per_seed(arm, 8)
        rs = [eight[s] / one[s] for s in sorted(set(one) & set(eight)) if one[s] > 0]
        ratios[arm] = sum(rs) / len(rs) if rs else float("nan")
    best = min(ratios, key=ratios.get)
    print("V3 mean 8x / 1x value NLL: " + ", ".join(f"{a} {v:.2f}" for a, v in ratios.items())
          + f" -> {'holds' if best == 'tapa' else 'does not hold'} (flattest: {best})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
