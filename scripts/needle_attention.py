"""Dilution or distortion? The needle-retrieval attention probe over a results folder (issue 18; R33).

For every finished needle-retrieval run of RESULTS (a `lab sweep length-extrapolation` folder), runs
`lab needle-attention` at 1x, 2x, 4x and 8x the training length, picks the run's retrieval head (the
(layer, head) with the largest needle share at 1x; ties: the lower layer, then head), and prints per
encoding the retrieval heads' needle share s, log-ratio r (nats) and far share at each length, mean over
seeds, with the share a pure dilution would leave, s* = R e^r(1x) / (R e^r(1x) + H), then R33's reading
(docs/analysis-rules.md): dilution when r(4x) >= r(1x) - 0.5, distortion when r(4x) < r(1x) - 1, mixed between.
Then R34: on the rows that predict each value character j, the retrieval head's aim share a_j (the part of its
needle attention on the needle's own copy of character j) and the greedy accuracy of character j; H-aim when the
mean a at 4x is at least 0.2 below 1x, refuted when within 0.05.

Usage:
  python3 scripts/needle_attention.py results/length-r31 [--lab target/release/lab] [--n 256] [--json OUT]
Needs polars (pip install polars).
"""

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

try:
    import polars as pl
except ImportError:
    sys.exit("polars is not installed: pip install polars")

FACTORS = [1, 2, 4, 8]


def probe(lab, run_dir, seq_len, n):
    """Every value character's rows of `lab needle-attention`, by value index."""
    out = subprocess.run([lab, "needle-attention", str(run_dir), "--seq-len", str(seq_len), "--n", str(n)],
                         check=True, capture_output=True, text=True).stdout
    by_j = {}
    for line in out.splitlines():
        h = json.loads(line)
        by_j.setdefault(h["value_index"], []).append(h)
    return by_j


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--lab", default="target/release/lab")
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--json", help="also write every head's rows here (JSON lines)")
    args = ap.parse_args()
    runs = pl.read_parquet(Path(args.results) / "runs.parquet")
    runs = runs.filter((pl.col("status") == "done") & (pl.col("task") == "needle")).sort(["encoding", "seed"])
    if runs.height == 0:
        sys.exit(f"{args.results}: no finished needle-retrieval run")
    rows = []
    per_run = []
    for r in runs.iter_rows(named=True):
        run_dir = Path(args.results) / "runs" / r["run_id"]
        probed = {f: probe(args.lab, run_dir, f * r["seq_len"], args.n) for f in FACTORS}
        value_len = len(probed[1])
        rows_j = {(f, j): probed[f][j] for f in FACTORS for j in range(value_len)}
        rows += [h for v in rows_j.values() for h in v]
        heads = {f: rows_j[(f, 0)] for f in FACTORS}
        best = max(heads[1], key=lambda h: (h["needle_share"], -h["layer"], -h["head"]))
        same = lambda h: (h["layer"], h["head"]) == (best["layer"], best["head"])  # noqa: E731
        pick = {f: next(h for h in heads[f] if same(h)) for f in FACTORS}
        aim = {f: [next(h for h in rows_j[(f, j)] if same(h)) for j in range(value_len)] for f in FACTORS}
        label = r["encoding"] + (" δ-uniform" if r.get("pope_delta_init") == "uniform" else "")
        per_run.append((label, r["seed"], best["layer"], best["head"], pick, aim))
    if args.json:
        with open(args.json, "w") as f:
            for h in rows:
                f.write(json.dumps(h) + "\n")
    print(f"{args.results}: {len(per_run)} runs, {args.n} held-out contexts per length; retrieval head = "
          "largest needle share at 1x (R33)")
    print(f"{'encoding':<16}{'seed':>5}{'head':>7}  " + "  ".join(f"{f}x: s / r / far" for f in FACTORS))
    for label, seed, layer, head, pick, _ in per_run:
        cells = "  ".join(f"{pick[f]['needle_share']:.2f} / {pick[f]['log_ratio']:5.2f} / {pick[f]['far_share']:.2f}"
                          for f in FACTORS)
        print(f"{label:<16}{seed:>5}{f'L{layer}H{head}':>7}  {cells}")
    print()
    for label in sorted({p[0] for p in per_run}):
        mine = [p for p in per_run if p[0] == label]
        mean = {f: {k: sum(p[4][f][k] for p in mine) / len(mine) for k in ("needle_share", "log_ratio", "far_share")}
                for f in FACTORS}
        r1 = mean[1]["log_ratio"]
        line = []
        for f in FACTORS:
            # A pure dilution: the 1x advantage r over this length's needle (R) and haystack (H) counts.
            ratios = []
            for p in mine:
                h = p[4][f]
                big_r, big_h = h["needle_positions"], h["haystack_positions"]
                e = big_r * math.exp(p[4][1]["log_ratio"])
                ratios.append(e / (e + big_h))
            s_star = sum(ratios) / len(ratios)
            line.append(f"{f}x: s {mean[f]['needle_share']:.3f} (dilution alone {s_star:.3f}), "
                        f"r {mean[f]['log_ratio']:.2f}, far {mean[f]['far_share']:.2f}")
        d4 = mean[4]["log_ratio"] - r1
        verdict = ("H-dilution supported" if d4 >= -0.5 else
                   "H-distortion supported" if d4 < -1.0 else "mixed")
        print(f"{label} (mean over {len(mine)} seeds): " + "; ".join(line))
        print(f"  r(4x) - r(1x) = {d4:+.2f} nats -> {verdict}")

    # R34: where in the needle the retrieval head looks, per value character row j.
    print()
    print("R34: aim share a_j (needle attention on the needle's copy of the predicted character) / greedy accuracy "
          "of character j, retrieval head")
    for label, seed, layer, head, _, aim in per_run:
        cells = "  ".join(f"{f}x: " + " ".join(f"{h['aim_share']:.2f}/{h['value_accuracy']:.2f}" for h in aim[f])
                          for f in FACTORS)
        print(f"{label:<16}{seed:>5}{f'L{layer}H{head}':>7}  {cells}")
    for label in sorted({p[0] for p in per_run}):
        mine = [p for p in per_run if p[0] == label]
        a = {f: sum(h["aim_share"] for p in mine for h in p[5][f]) / sum(len(p[5][f]) for p in mine)
             for f in FACTORS}
        acc = {f: sum(h["value_accuracy"] for p in mine for h in p[5][f]) / sum(len(p[5][f]) for p in mine)
               for f in FACTORS}
        d = a[4] - a[1]
        verdict = ("H-aim supported" if d <= -0.2 else "H-aim refuted" if d >= -0.05 else "partial")
        print(f"{label} (mean over rows and {len(mine)} seeds): " +
              "; ".join(f"{f}x: a {a[f]:.3f}, accuracy {acc[f]:.3f}" for f in FACTORS) +
              f"\n  a(4x) - a(1x) = {d:+.3f} -> {verdict}")


if __name__ == "__main__":
    main()
