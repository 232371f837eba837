"""The sparsity stage: which weights did RL fine-tuning move, per tensor, at which precision.

Compares a base and a fine-tuned checkpoint tensor by tensor, streaming (never both models, nor even
one whole large tensor, in memory), and counts per tensor how many elements changed under three
criteria, because "changed" depends on the precision you look with:

| column              | an element counts when                        | what it shows                      |
| ------------------- | --------------------------------------------- | ---------------------------------- |
| ``changed_eta_{e}`` | ``|w'-w| > e * max(|w|, |w'|)`` (float64)     | relative update above ``e``: the   |
|                     |                                               | precision-independent "it moved"   |
| ``equal_bf16``      | ``bf16(w)``, ``bf16(w')`` have identical bits | updates bf16 cannot represent      |
|                     |                                               | (Gate III: below the bf16 spacing) |
| ``equal_stored``    | ``w``, ``w'`` have identical bits in the      | the literal "untouched" count a    |
|                     | wider of the two stored dtypes                | bitwise checkpoint diff sees       |

``changed_*`` counts changed elements; ``equal_*`` count equal ones (``numel - equal`` = changed).

Exact semantics (tested in tests/test_sparsity.py):

- eta criterion, in float64: both sides are widened exactly to float64, then an element is changed
  iff ``fl64(|w'-w|) > fl64(eta * max(|w|, |w'|))``. At the tolerance boundary (equality) it is NOT
  changed; both-zero pairs are not changed (0 > 0 is false). For float32/bf16/fp16 data and
  ``1e-30 <= eta <= 0.25`` a float32 fast path computes ``r = |w'-w| / max`` and decides every element
  whose ``r`` is more than ~2^-20 relative away from ``eta``; the few inside that band are recomputed
  in float64, so the result is identical to the float64 rule (the float32 difference is exact by
  Sterbenz wherever ``r`` can be near ``eta``).
- Non-finite values: for a pair where either side is NaN or +-inf, changed iff the values differ,
  NaN counting as equal to NaN: NaN->NaN and inf->inf (same sign) are unchanged; finite<->NaN,
  finite<->inf and inf->-inf are changed, at every eta. ``nonfinite_base``/``nonfinite_final`` count
  the NaN/inf elements of each side (a diverged run shows up there).
- Bitwise columns compare bit patterns: NaN->NaN with the same payload is equal, and -0.0 vs 0.0 is
  NOT bitwise equal although it is numerically unchanged for every eta. torch's cast to bf16
  canonicalises NaN, so any NaN->NaN pair is bf16-equal.
- Mixed dtypes (e.g. fp32 base vs bf16 final): ``equal_stored`` compares after casting both to
  ``torch.promote_types`` of the two (exact), and both dtypes are recorded; ``equal_bf16`` casts each
  side to bf16 (round to nearest even); the eta rule widens both to float64.
- Integer/bool tensors go through the same rules after an exact cast to float64 (|x| < 2^53).
- Tied weights: ``lm_head.weight`` is usually absent from a tied checkpoint; then only the stored
  embedding is reported. If it is stored on only one side, the other side's embedding stands in for
  it and the row has ``tied=True``.

Outputs (``main``): a per-tensor parquet, one row per tensor, columns ``[precision, seed,] tensor,
module, layer, numel, base_dtype, final_dtype, tied, equal_stored, equal_bf16, nonfinite_base,
nonfinite_final, changed_eta_1e-03, ...`` (``eta_column``; ``to_long`` melts it into a tidy
``eta, changed`` form), and ``<out stem>.summary.json`` with whole-model, per-module-type and
per-layer aggregates (``summarize``).

Code: this module names tensors, builds the tables and is the stage (``run``); the counting kernel
is ``sparsity_kernel``, the streaming checkpoint reader ``checkpoint_io``.

Memory: each side is read through ``safe_open`` row windows of ``window_bytes`` (dim-0 slices, so a
huge tensor never loads whole); the handle is reopened once that much of the file has been touched,
because pages of a safetensors mmap stay in RSS while the handle lives. Peak RSS is the interpreter
plus ~2 windows plus a few cache-sized chunk buffers (bench: 431 MB for a 1 GB pair).

Speed: ~25 vectorised numpy passes per cache-sized chunk, single-threaded by default (``threads``
splits windows over worker threads). bench/bench_sparsity.py measures it against the I/O floor.
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from workflow_scripts.measures.checkpoint_io import (
    DEFAULT_WINDOW_BYTES,
    TensorPair,
    WindowReader,
    checkpoint_tensors,
    iter_windows,
    pair_tensors,
    window_elems_for,
)
from workflow_scripts.measures.diff_setup import (
    add_diff_options,
    default_etas,
    diff_options,
    layer_index,
    module_type,
)
from workflow_scripts.measures.sparsity_kernel import (
    DEFAULT_CHUNK_ELEMS,
    EtaPlan,
    TensorCounts,
    Workspace,
    diff_span,
    narrower_float,
    spans_of,
    torch_threads,
)
from workflow_scripts.runtime.atomic import write_json, write_parquet
from workflow_scripts.runtime.smk import main_from
from workflow_scripts.runtime.threads import log_startup, process_age_s


def eta_label(eta: float) -> str:
    """Shortest lossless scientific label: 1e-3 -> '1e-03', 2.5e-4 -> '2.5e-04'."""
    return np.format_float_scientific(eta, trim="-", exp_digits=2)


def eta_column(eta: float) -> str:
    return f"changed_eta_{eta_label(eta)}"


# ------------------------------------------------------------------------------------------ the table


def diff_checkpoints(
    base: str | os.PathLike,
    final: str | os.PathLike,
    etas: Sequence[float] | None = None,
    *,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
    threads: int = 1,
    cast_base_to_final: bool = False,
) -> pd.DataFrame:
    """Per-tensor sparsity table (columns: see module docstring) of ``final`` against ``base``.

    ``cast_base_to_final``: compare against the weights the run really started from. A bf16 arm
    loads an fp32 base as bf16(base); without the cast the eta criterion would count that rounding
    (up to ~2e-3 relative) as an update. Applies only where the final dtype is the narrower float.
    ``etas``: None = the schema default of ``sparsity.etas``.

    ``base``/``final``: a model folder (single or sharded safetensors), an index json or a file.
    ``threads`` worker threads split each window (numpy and torch release the GIL in the kernels);
    torch's own intra-op threading is switched off meanwhile, as it only adds sync on small chunks.
    """
    plan = EtaPlan.make(default_etas() if etas is None else etas)
    base_infos, base_desc = checkpoint_tensors(base)
    final_infos, final_desc = checkpoint_tensors(final)
    pairs = pair_tensors(base_infos, final_infos, base_desc, final_desc)
    window = window_elems_for(pairs, window_bytes)
    workspaces = [Workspace(chunk_elems) for _ in range(max(1, threads))]
    ra, rb = WindowReader(window_bytes), WindowReader(window_bytes)
    rows = []
    with torch_threads(1), ThreadPoolExecutor(len(workspaces)) as pool:
        for pair in pairs:
            total = TensorCounts(changed=[0] * len(plan.etas))
            for wa, wb in iter_windows(pair, ra, rb, window):
                if cast_base_to_final and narrower_float(wb.dtype, wa.dtype):
                    wa = wa.to(wb.dtype)
                spans = spans_of(wa.numel(), len(workspaces), chunk_elems)
                if len(spans) == 1:
                    total.add(diff_span(wa, wb, plan, workspaces[0]))
                    continue
                jobs = [
                    pool.submit(diff_span, wa[s:e], wb[s:e], plan, ws)
                    for (s, e), ws in zip(spans, workspaces, strict=False)
                ]
                for job in jobs:
                    total.add(job.result())
            rows.append(_row(pair, total, plan))
    ra.close()
    rb.close()
    return _frame(rows, plan.etas)


def _row(pair: TensorPair, c: TensorCounts, plan: EtaPlan) -> dict:
    row = {
        "tensor": pair.name,
        "module": module_type(pair.name),
        "layer": layer_index(pair.name),
        "numel": pair.base.numel,
        "base_dtype": pair.base.dtype,
        "final_dtype": pair.final.dtype,
        "tied": pair.tied,
        "equal_stored": c.equal_stored,
        "equal_bf16": c.equal_bf16,
        "nonfinite_base": c.nonfinite_base,
        "nonfinite_final": c.nonfinite_final,
    }
    row.update({eta_column(eta): n for eta, n in zip(plan.etas, c.changed, strict=True)})
    return row


_INT_COLUMNS = ("layer", "numel", "equal_stored", "equal_bf16", "nonfinite_base", "nonfinite_final")


def _frame(rows: list[dict], etas: Sequence[float]) -> pd.DataFrame:
    columns = ["tensor", "module", "layer", "numel", "base_dtype", "final_dtype", "tied", "equal_stored"]
    columns += ["equal_bf16", "nonfinite_base", "nonfinite_final", *(eta_column(e) for e in etas)]
    frame = pd.DataFrame(rows, columns=columns)
    ints = [*_INT_COLUMNS, *(eta_column(e) for e in etas)]
    return frame.astype(dict.fromkeys(ints, "int64") | {"tied": "bool"})


def etas_of(frame: pd.DataFrame) -> list[float]:
    """The etas of a per-tensor table, from its ``changed_eta_*`` columns."""
    return [float(c.removeprefix("changed_eta_")) for c in frame.columns if c.startswith("changed_eta_")]


def to_long(frame: pd.DataFrame) -> pd.DataFrame:
    """Tidy form: one row per (tensor, eta) with columns ``eta`` and ``changed``."""
    eta_cols = [c for c in frame.columns if c.startswith("changed_eta_")]
    ids = [c for c in frame.columns if c not in eta_cols]
    long = frame.melt(id_vars=ids, value_vars=eta_cols, var_name="eta", value_name="changed")
    long["eta"] = long["eta"].str.removeprefix("changed_eta_").astype(float)
    return long


# ---------------------------------------------------------------------------------------- aggregates


def _aggregate(group: pd.DataFrame, etas: Sequence[float]) -> dict:
    numel = int(group["numel"].sum())
    out: dict = {
        "n_tensors": len(group),
        "numel": numel,
        "equal_stored_fraction": _frac(group["equal_stored"].sum(), numel),
        "equal_bf16_fraction": _frac(group["equal_bf16"].sum(), numel),
        "tensors_bf16_equal": int((group["equal_bf16"] == group["numel"]).sum()),
        "nonfinite_final": int(group["nonfinite_final"].sum()),
        "changed": {},
        "changed_fraction": {},
        "tensors_zero_changed": {},
    }
    for eta in etas:
        col, label = eta_column(eta), eta_label(eta)
        out["changed"][label] = int(group[col].sum())
        out["changed_fraction"][label] = _frac(group[col].sum(), numel)
        out["tensors_zero_changed"][label] = int((group[col] == 0).sum())
    return out


def _frac(num: float, den: int) -> float | None:
    return float(num) / den if den else None


def summarize(frame: pd.DataFrame, etas: Sequence[float] | None = None) -> dict:
    """Whole-model, per-module-type and per-layer aggregates (fractions are element-weighted)."""
    etas = list(etas) if etas is not None else etas_of(frame)
    return {
        "etas": [float(e) for e in etas],
        "eta_labels": [eta_label(e) for e in etas],
        "model": _aggregate(frame, etas),
        "by_module": {str(k): _aggregate(g, etas) for k, g in frame.groupby("module", sort=True)},
        "by_layer": {str(k): _aggregate(g, etas) for k, g in frame.groupby("layer", sort=True)},
    }


def summary_path(out: str | os.PathLike) -> Path:
    """results/sparsity/bf16/seed0.parquet -> results/sparsity/bf16/seed0.summary.json."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".parquet") + ".summary.json")


# ---------------------------------------------------------------------------------------------- stage


def run(
    base: str | os.PathLike,
    final: str | os.PathLike,
    out: str | os.PathLike,
    summary: str | os.PathLike | None = None,
    etas: Sequence[float] | None = None,
    precision: str | None = None,
    seed: int | None = None,
    threads: int = 1,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    cast_base_to_final: bool = True,
) -> dict:
    """The stage: per-tensor table of ``final`` vs ``base`` into ``out``, aggregates into ``summary``.

    ``cast_base_to_final`` (default on, in the workflow and the CLI alike): compare with the weights
    the run really started from (see ``diff_checkpoints``).
    """
    log_startup(process_age_s())
    etas = default_etas() if etas is None else list(etas)
    start = time.perf_counter()
    frame = diff_checkpoints(
        base, final, etas, window_bytes=window_bytes, threads=threads, cast_base_to_final=cast_base_to_final
    )
    if seed is not None:
        frame.insert(0, "seed", seed)
    if precision is not None:
        frame.insert(0, "precision", precision)
    record = summarize(frame, etas)
    record.update({"base": str(base), "final": str(final), "base_cast_to_final": cast_base_to_final})
    if precision is not None:
        record["precision"] = precision
    if seed is not None:
        record["seed"] = seed
    write_parquet(out, frame)
    write_json(summary or summary_path(out), record)
    model = record["model"]
    fractions = ", ".join(f"eta {k}: {v:.4g}" for k, v in model["changed_fraction"].items())
    print(
        f"sparsity: {model['n_tensors']} tensors, {model['numel']} elements in "
        f"{time.perf_counter() - start:.1f}s; changed fraction {fractions}; "
        f"bf16-equal {model['equal_bf16_fraction']:.4g} -> {out}",
        file=sys.stderr,
    )
    return record


def from_snakemake(smk) -> None:
    run(
        smk.input.base,
        smk.input.final,
        smk.output.table,
        smk.output.summary,
        etas=list(smk.params.etas),
        precision=smk.wildcards.precision,
        seed=int(smk.wildcards.seed),
        threads=smk.threads,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.sparsity",
        description="Per-tensor update sparsity of a fine-tuned checkpoint against its base.",
    )
    p.add_argument("--base", required=True, help="base model folder, index json or .safetensors file")
    p.add_argument("--final", required=True, help="fine-tuned model folder, index json or .safetensors file")
    p.add_argument(
        "--out", required=True, help="per-tensor parquet (results/sparsity/{precision}/seed{seed}.parquet)"
    )
    p.add_argument("--summary", help="aggregates json (default: <out stem>.summary.json)")
    p.add_argument("--precision", help="if given, added as a constant 'precision' column")
    p.add_argument("--seed", type=int, help="if given, added as a constant 'seed' column")
    add_diff_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run(
        args.base,
        args.final,
        args.out,
        args.summary,
        precision=args.precision,
        seed=args.seed,
        **diff_options(args),
    )
    return 0


if __name__ == "__main__":
    main_from(globals())
