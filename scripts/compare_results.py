"""Compare two lab results folders by value: runs, curves, spectrum and fit tables equal
(timing columns left out, rows sorted). Exit 1 on a difference.

    python3 scripts/compare_results.py results/a results/b
"""
import sys

import polars as pl

TIMING = {"wall_time_s", "ms_per_step", "tokens_per_s", "probe_ms"}


def load(folder: str, table: str) -> pl.DataFrame:
    df = pl.read_parquet(f"{folder}/{table}.parquet")
    df = df.select([c for c in df.columns if c not in TIMING])
    return df.sort(df.columns)


def main() -> int:
    a, b = sys.argv[1], sys.argv[2]
    ok = True
    for table in ["runs", "curves", "spectrum", "fit"]:
        da, db = load(a, table), load(b, table)
        same = da.columns == db.columns and da.equals(db)
        print(f"{table:9s} {da.height:6d} rows vs {db.height:6d} rows: {'equal' if same else 'DIFFERENT'}")
        ok &= same
    print("merged Slurm result equals the local run" if ok else "results differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
