"""Load every table a sweep wrote with Python Polars and check columns and types.

Usage: python3 check_tables.py RESULTS_DIR

The expected schemas are those documented in results/README.md. Exits non-zero with a one-line
message per problem. Run by `cargo test` (lab/tests/sweep_smoke.rs) on a smoke sweep.
"""

import json
import sys
from pathlib import Path

try:
    import polars as pl
except ImportError:
    sys.exit("polars is not installed: run `pip install -r requirements-test.txt` (or `make test`)")

S, I64, F64, I32, B = pl.Utf8, pl.Int64, pl.Float64, pl.Int32, pl.Boolean

EXPECTED = {
    "runs": {
        "schema_version": I32, "run_id": S, "sweep": S, "preset": S, "status": S,
        "fail_step": I64, "fail_reason": S,
        "task": S, "variant": S, "vocab_size": I64, "seq_len": I64, "block_len": I64,
        "dep_width": I64, "noise": F64, "encoding": S, "rope_base": F64, "pair_layout": S,
        "d_model": I64, "n_layers": I64, "n_heads": I64, "d_ff": I64, "steps": I64,
        "batch_size": I64, "lr": F64, "warmup_steps": I64, "min_lr_ratio": F64,
        "weight_decay": F64, "beta1": F64, "beta2": F64, "adam_eps": F64, "grad_clip": F64,
        "eval_every": I64, "eval_batches": I64, "seed": I64,
        "train_examples": I64, "attention": S, "max_grad_norm": F64,
        "final_train_loss": F64, "final_eval_loss": F64, "final_eval_accuracy": F64,
        "val_loss": F64, "val_accuracy": F64, "selected": B,
        "answer_accuracy": F64, "solution_valid": F64,
        "acc_tf_structure": F64, "acc_tf_name": F64, "acc_tf_definition": F64, "acc_tf_value": F64,
        "acc_tf_result": F64, "acc_tf_answer": F64, "acc_tf_operator": F64, "acc_tf_leaf": F64, "answer_accuracy_train_structures": F64,
        "acc_tf_definition_train_structures": F64, "acc_shift0": F64, "acc_shift_nonzero": F64,
        "init_eval_loss": F64, "effective_freq": F64, "effective_freq_init": F64,
        "effective_freq_batch_sd": F64, "spectrum_entropy": F64, "spectrum_entropy_init": F64,
        "argmax_freq": F64, "steps_done": I64, "converged_step": I64, "positional_layer": I64,
        "effective_freq_positional": F64, "positional_kl": F64, "dep_width_mi": I64,
        "reference_freq": F64, "wall_time_s": F64, "ms_per_step": F64,
        "tokens_per_s": F64, "probe_ms": F64, "backend": S, "lab_version": S, "config_json": S,
    },
    "curves": {
        "schema_version": I32, "run_id": S, "step": I64, "split": S, "loss": F64,
        "accuracy": F64, "lr": F64, "grad_norm": F64, "effective_freq": F64,
        "effective_freq_batch_sd": F64, "spectrum_entropy": F64, "argmax_freq": F64,
        "answer_accuracy": F64, "answer_ops": I64,
    },
    "spectrum": {
        "schema_version": I32, "run_id": S, "encoding": S, "step": I64, "layer": I64,
        "head": I64, "freq_index": I64, "theta": F64, "energy": F64, "energy_frac": F64,
    },
    "layers": {
        "schema_version": I32, "run_id": S, "encoding": S, "step": I64, "layer": I64,
        "effective_freq": F64, "spectrum_entropy": F64, "argmax_freq": F64, "kl_from_init": F64,
        "is_final": B, "is_positional": B, "attn_top_lag": I64, "attn_top_lag_mass": F64,
        "attn_mass_in_window": F64,
    },
    "fit": {
        "schema_version": I32, "sweep": S, "preset": S, "group": S, "encoding": S,
        "variant": S, "width_source": S, "pooling": S, "beta": F64, "c": F64, "r2": F64,
        "beta_ci_low": F64, "beta_ci_high": F64, "c_ci_low": F64, "c_ci_high": F64,
        "n": I64, "n_seeds": I64, "n_boot": I64, "resample": S, "reference_c": F64,
        "n_widths": I64, "width_span": F64, "min_seeds_per_width": I64, "min_accuracy": F64,
        "verdict": S,
    },
}


# Schema 3: an encoding's own parameters are columns only when a run of that encoding is in the
# table (null for the others); when present they have these types.
OPTIONAL = {
    "runs": {
        "pope_delta_init": S, "tapa_rho": F64, "tapa_alpha": F64, "tapa_phase": S,
        "tapa_phase_init_scale": F64, "rope_p": F64,
        "rotary_dim": I64, "nope_every": I64, "canon_len": I64, "answer_curve": I64,
    },
}


def main() -> int:
    root = Path(sys.argv[1])
    problems = []
    for table, expected in EXPECTED.items():
        path = root / f"{table}.parquet"
        df = pl.read_parquet(path)
        optional = OPTIONAL.get(table, {})
        for col, dtype in optional.items():
            if col in df.schema and df.schema[col] != dtype:
                problems.append(f"{table}.{col}: {df.schema[col]} instead of {dtype}")
        for col, dtype in expected.items():
            if col not in df.schema:
                problems.append(f"{table}: missing column {col}")
            elif df.schema[col] != dtype:
                problems.append(f"{table}.{col}: {df.schema[col]} instead of {dtype}")
        extra = set(df.columns) - set(expected) - set(optional)
        if extra:
            problems.append(f"{table}: undocumented columns {sorted(extra)}")
        if df.height == 0:
            problems.append(f"{table}: no rows")
        # The per-run parts load lazily as one table too; the parts of `runs` differ in their
        # task's and encoding's columns, so they are concatenated diagonally.
        if table == "runs":
            parts = sorted((root / "runs").glob("*/runs.parquet"))
            lazy = pl.concat([pl.read_parquet(p) for p in parts], how="diagonal_relaxed")
        elif table != "fit":
            lazy = pl.scan_parquet(str(root / "runs" / "*" / f"{table}.parquet")).collect()
            if lazy.height != df.height:
                problems.append(f"{table}: merged has {df.height} rows, parts {lazy.height}")
    runs = pl.read_parquet(root / "runs.parquet")
    if runs["run_id"].n_unique() != runs.height:
        problems.append("runs: duplicate run_id")
    # Schema 2: the config JSON holds the run's task as its own section, and the row the task's
    # own parameters only (the undocumented-columns check above refuses other tasks' ones).
    for task, cfg in zip(runs["task"], runs["config_json"]):
        section = json.loads(cfg)["task"]
        if not isinstance(section, dict) or section.get("kind") != task:
            problems.append(f"runs: config_json task section {section!r} does not name task {task}")
            break
    # Schema 3: the same for the encoding, and a run's row has its own encoding's parameters
    # only (a PoPE row has pope_delta_init, a RoPE row no TAPA parameter).
    own = {"pope": ["pope_delta_init"], "tapa": ["tapa_rho", "tapa_alpha", "tapa_phase"],
           "p-rope": ["rope_p"], "partial-rope": ["rotary_dim"]}
    for row in runs.iter_rows(named=True):
        section = json.loads(row["config_json"])["encoding"]
        if not isinstance(section, dict) or section.get("kind") != row["encoding"]:
            problems.append(f"runs: config_json encoding section {section!r} does not name {row['encoding']}")
            break
        for enc, cols in own.items():
            for col in cols:
                if col in row and (row[col] is not None) != (row["encoding"] == enc):
                    problems.append(f"runs: {row['encoding']} run {row['run_id']} has {col} = {row[col]!r}")
    spectrum = pl.read_parquet(root / "spectrum.parquet")
    sums = spectrum.group_by(["run_id", "step", "layer", "head"]).agg(pl.col("energy_frac").sum())
    if (sums["energy_frac"] - 1.0).abs().max() > 1e-9:
        problems.append("spectrum: energy_frac does not sum to 1 per (run, step, layer, head)")
    layers = pl.read_parquet(root / "layers.parquet")
    finals = layers.filter(pl.col("is_final")).group_by("run_id").agg(pl.len().alias("n"))
    expect = runs.filter(pl.col("status") == "done").select("run_id", "n_layers")
    joined = expect.join(finals, on="run_id", how="left")
    if joined.filter(pl.col("n").is_null() | (pl.col("n") != pl.col("n_layers"))).height:
        problems.append("layers: a finished run lacks one final row per layer")
    pos = layers.filter(pl.col("is_final") & pl.col("is_positional")).join(
        runs.select("run_id", "positional_layer"), on="run_id")
    if pos.filter(pl.col("layer") != pl.col("positional_layer")).height:
        problems.append("layers: is_positional disagrees with runs.positional_layer")
    for p in problems:
        print(p)
    print(f"checked {len(EXPECTED)} tables in {root}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
