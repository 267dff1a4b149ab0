"""Execute a notebook end to end against a sweep's results and save the executed copy.

Usage: python3 notebooks/execute.py NOTEBOOK RESULTS_DIR [OUT]

Runs every cell with nbclient (kernel `python3`, working directory = the repository root) with
LAB_RESULTS=RESULTS_DIR, and writes the notebook with its outputs to OUT (default:
RESULTS_DIR/notebooks/<name>.ipynb). Exits non-zero, naming the cell, when a cell fails.
Used by CI (.ci/run) on a smoke sweep, and by `make notebooks`.
"""

import os
import sys
from pathlib import Path

try:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
except ImportError:
    sys.exit("nbclient is not installed: pip install -r notebooks/requirements.txt")

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[2])
    notebook, results = Path(sys.argv[1]), Path(sys.argv[2]).resolve()
    if not notebook.is_file():
        sys.exit(f"no notebook {notebook}")
    if not any(results.glob("*.parquet")):
        sys.exit(f"no tables (*.parquet) in {results}: run the sweep first")
    out = Path(sys.argv[3]) if len(sys.argv) == 4 else results / "notebooks" / notebook.name
    nb = nbformat.read(notebook, as_version=4)
    os.environ["LAB_RESULTS"] = str(results)
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    try:
        client.execute()
    except CellExecutionError as e:
        print(f"{notebook}: a cell failed:\n{e}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    nbformat.write(nb, tmp)
    tmp.replace(out)
    n = sum(1 for c in nb.cells if c.cell_type == "code")
    print(f"{notebook}: {n} code cells ran; executed copy in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
