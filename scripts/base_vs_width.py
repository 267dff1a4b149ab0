#!/usr/bin/env python3
"""Base versus width (docs/analysis-rules.md R7): does θ_eff follow the data's width or the rotary
base and the training length?

Per variant, least squares over its finished runs of
    ln θ_eff = a − β ln B + γ ln base + δ ln L
with θ_eff the run's positional-layer effective frequency, B the block width, `base` the RoPE base
and L the training context; 95 % intervals from 2000 bootstrap resamples of runs (seed 0).

Usage: python3 scripts/base_vs_width.py [results/base-vs-width]
(needs polars and numpy: pip install -r notebooks/requirements.txt)
"""

import sys

import numpy as np
import polars as pl


def regress(df: pl.DataFrame) -> np.ndarray:
    """(a, β, γ, δ) of ln θ = a − β ln B + γ ln base + δ ln L."""
    x = np.column_stack(
        [
            np.ones(len(df)),
            -np.log(df["block_len"].to_numpy()),
            np.log(df["rope_base"].to_numpy()),
            np.log(df["seq_len"].to_numpy()),
        ]
    )
    y = np.log(df["effective_freq_positional"].to_numpy())
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return coef, x, y


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else "results/base-vs-width"
    runs = pl.read_parquet(f"{root}/runs.parquet").filter(
        (pl.col("status") == "done") & pl.col("effective_freq_positional").is_not_null()
    )
    rng = np.random.default_rng(0)
    print("variant  runs   β [95 %]               γ (base) [95 %]         δ (L) [95 %]            R²")
    for variant in sorted(runs["variant"].unique()):
        df = runs.filter(pl.col("variant") == variant)
        coef, x, y = regress(df)
        r2 = 1 - np.sum((y - x @ coef) ** 2) / np.sum((y - y.mean()) ** 2)
        boot = []
        for _ in range(2000):
            idx = rng.integers(0, len(df), len(df))
            c, *_ = np.linalg.lstsq(x[idx], y[idx], rcond=None)
            boot.append(c)
        lo, hi = np.percentile(np.array(boot), [2.5, 97.5], axis=0)
        cells = [f"{coef[k]:+.2f} [{lo[k]:+.2f}, {hi[k]:+.2f}]".ljust(24) for k in (1, 2, 3)]
        print(f"{variant:8} {len(df):4}   {''.join(cells)}{r2:.2f}")
    print()
    table = (
        runs.select("variant", "seq_len", "rope_base", "block_len", "positional_layer",
                    "effective_freq_positional", "final_eval_accuracy")
        .with_columns((np.pi / pl.col("block_len")).alias("pi_over_B"))
        .sort("variant", "seq_len", "rope_base", "block_len")
    )
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=200):
        print(table)


if __name__ == "__main__":
    main()
