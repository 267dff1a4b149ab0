#!/usr/bin/env python3
"""Width and context length (docs/analysis-rules.md R11 on `window`, R30 on `recall`).

Least squares over the finished RoPE runs of one variant in the given presets (by default variant `window` in
presets `window` (L = 128) and `window-long` (L = 512), R11) of
    ln θ_eff = a − β ln B + δ ln L
with θ_eff the run's positional-layer effective frequency, B the block width (the window) and L the
training context; 95 % intervals from 2000 bootstrap resamples of runs (seed 0). The law predicts
β = 1, δ = 0; θ_eff ≈ k·π/√(W·L) predicts β = 0.5, δ = −0.5.

Usage: python3 scripts/width_and_length.py [results/block-width] [--variant V] [--presets P1,P2]
  R11: python3 scripts/width_and_length.py results/block-width
  R30: python3 scripts/width_and_length.py results/block-width-r30 --variant recall --presets recall-context
(needs polars and numpy: pip install -r notebooks/requirements.txt)
"""

import argparse
import sys

import numpy as np
import polars as pl


def regress(df: pl.DataFrame) -> np.ndarray:
    """(a, β, δ) of ln θ = a − β ln B + δ ln L."""
    x = np.column_stack(
        [
            np.ones(len(df)),
            -np.log(df["block_len"].to_numpy()),
            np.log(df["seq_len"].to_numpy()),
        ]
    )
    y = np.log(df["effective_freq_positional"].to_numpy())
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return coef


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default="results/block-width")
    parser.add_argument("--variant", default="window")
    parser.add_argument("--presets", default="window,window-long")
    args = parser.parse_args()
    root, variant, presets = args.root, args.variant, args.presets.split(",")
    runs = pl.read_parquet(f"{root}/runs.parquet").filter(
        (pl.col("status") == "done")
        & (pl.col("encoding") == "rope")
        & (pl.col("variant") == variant)
        & pl.col("preset").is_in(presets)
        & pl.col("effective_freq_positional").is_not_null()
    )
    if runs.height < 4 or runs["seq_len"].n_unique() < 2:
        sys.exit(f"{root}: needs {variant} runs of presets {presets} at two context lengths")
    coef = regress(runs)
    rng = np.random.default_rng(0)
    boot = np.array([regress(runs[rng.integers(0, runs.height, runs.height)]) for _ in range(2000)])
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    pred = np.column_stack([np.ones(runs.height), -np.log(runs["block_len"].to_numpy()), np.log(runs["seq_len"].to_numpy())]) @ coef
    y = np.log(runs["effective_freq_positional"].to_numpy())
    r2 = 1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2)
    print(f"{variant} runs: {runs.height} (L = {sorted(runs['seq_len'].unique().to_list())})")
    print(f"  β (width)   = {coef[1]:.2f} [{lo[1]:.2f}, {hi[1]:.2f}]")
    print(f"  δ (context) = {coef[2]:.2f} [{lo[2]:.2f}, {hi[2]:.2f}]")
    print(f"  a = {coef[0]:.2f}, R² = {r2:.2f}")
    table = (
        runs.group_by("seq_len", "block_len")
        .agg(pl.col("effective_freq_positional").mean().alias("theta_eff"), pl.len().alias("runs"))
        .with_columns(
            (np.pi / pl.col("block_len")).alias("law_pi_over_W"),
            (np.pi / (pl.col("block_len") * pl.col("seq_len")).sqrt()).alias("pi_over_sqrt_WL"),
        )
        .sort("seq_len", "block_len")
    )
    with pl.Config(tbl_rows=-1, float_precision=4):
        print(table)


if __name__ == "__main__":
    main()
