"""The overlap stage: do different seeds of one arm move the same weights (Jaccard of update masks)?

For one precision, each seed's fine-tuned checkpoint is diffed against the shared base with the
eta rule of ``workflow_scripts.sparsity`` (same float64 semantics, NaN/inf rules and fast path), and
for every pair of seeds and every eta the Jaccard index of the two changed masks is reported next to
the value expected by chance for independent masks of the same densities p, q over N elements:

    J = |A & B| / |A | B|,        E[J] ~= E|A & B| / E|A | B| = pq / (p + q - pq),   ratio = J / E[J].

A ratio near 1 says the seeds change unrelated weights (noise-driven sparsity); well above 1 says a
shared structure decides which weights move (e.g. bf16 spacing hiding the same small updates).

Streaming: tensor by tensor and chunk by chunk, all seeds read in lockstep; only per-chunk masks exist,
and intersection/union/changed counts are accumulated, never whole-model masks.

Outputs (``main``): ``overlap.parquet`` with one row per (seed_a < seed_b, eta) over the whole model,
columns ``precision, seed_a, seed_b, eta, numel, intersection, union, jaccard, density_a, density_b,
jaccard_chance, ratio`` (jaccard is NaN when the union is empty; ratio is NaN when the chance value is
0 or NaN), and ``overlap.by_module.parquet`` with the same columns plus ``module`` (module types as in
``diff_setup.module_type``).
"""

from workflow_scripts.runtime import startup  # noqa: F401  first: no garbage collection during imports

# isort: split

import argparse
import itertools
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from workflow_scripts.measures.checkpoint_io import (
    DEFAULT_WINDOW_BYTES,
    TensorMismatchError,
    TensorPair,
    WindowReader,
    checkpoint_tensors,
    pair_tensors,
    row_windows,
    window_elems_for,
)
from workflow_scripts.measures.diff_setup import add_diff_options, default_etas, diff_options, module_type
from workflow_scripts.measures.sparsity_kernel import (
    DEFAULT_CHUNK_ELEMS,
    EtaPlan,
    Workspace,
    changed_masks,
    narrower_float,
    spans_of,
    torch_threads,
)
from workflow_scripts.runtime.atomic import write_parquet
from workflow_scripts.runtime.smk import main_from
from workflow_scripts.runtime.threads import log_startup, process_age_s

COLUMNS = [
    "precision", "seed_a", "seed_b", "eta", "numel", "intersection", "union", "jaccard",
    "density_a", "density_b", "jaccard_chance", "ratio",
]  # fmt: skip


def jaccard_chance(p: float, q: float) -> float:
    """E[J] ~= pq / (p + q - pq) for independent masks of densities p and q; NaN if both are empty."""
    den = p + q - p * q
    return p * q / den if den > 0 else math.nan


class _Counts:
    """Accumulated counts for one scope (whole model or one module type)."""

    def __init__(self, n_seeds: int, n_pairs: int, n_etas: int) -> None:
        self.numel = 0
        self.changed = np.zeros((n_seeds, n_etas), dtype=np.int64)
        self.inter = np.zeros((n_pairs, n_etas), dtype=np.int64)
        self.union = np.zeros((n_pairs, n_etas), dtype=np.int64)

    def add(self, other: "_Counts") -> None:
        self.numel += other.numel
        self.changed += other.changed
        self.inter += other.inter
        self.union += other.union


def _plan(
    base: str | os.PathLike, finals: Sequence[str | os.PathLike]
) -> tuple[list[TensorPair], list[list[TensorPair]]]:
    """Pairs of base vs each final, in one common tensor order; raise if the seeds disagree on names."""
    base_infos, base_desc = checkpoint_tensors(base)
    per_seed = []
    for final in finals:
        final_infos, final_desc = checkpoint_tensors(final)
        per_seed.append(pair_tensors(base_infos, final_infos, base_desc, final_desc))
    reference = per_seed[0]
    names = [p.name for p in reference]
    for final, pairs in zip(finals, per_seed, strict=True):
        by_name = {p.name: p for p in pairs}
        if set(by_name) != set(names):
            odd = sorted(set(by_name) ^ set(names))[0]
            raise TensorMismatchError(
                f"tensor {odd!r} is paired for {finals[0]} but not for {final} "
                "(a tied lm_head stored on one side only?)"
            )
    ordered = [[{p.name: p for p in pairs}[n] for n in names] for pairs in per_seed]
    return reference, ordered


def compute_overlap(
    base: str | os.PathLike,
    finals: Mapping[int, str | os.PathLike],
    etas: Sequence[float] | None = None,
    precision: str = "",
    *,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
    threads: int = 1,
    cast_base_to_final: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(whole-model, per-module) overlap tables for the seeds in ``finals`` (seed -> final checkpoint).

    ``threads`` worker threads split each window, and ``cast_base_to_final`` measures from the run's
    real start point, as in ``sparsity.diff_checkpoints``.
    """
    plan = EtaPlan.make(default_etas() if etas is None else etas)
    seeds = sorted(finals)
    if not seeds:
        raise ValueError("no final checkpoints given")
    reference, per_seed = _plan(base, [finals[s] for s in seeds])
    pairs = list(itertools.combinations(range(len(seeds)), 2))
    shape = (len(seeds), len(pairs), len(plan.etas))
    total = _Counts(*shape)
    by_module: dict[str, _Counts] = {}
    # every reader keeps up to its budget mapped: share the window budget among base + seeds
    budget = max(8 << 20, window_bytes * 2 // (len(seeds) + 1))
    window = window_elems_for(reference, budget)
    base_reader = WindowReader(budget)
    readers = [WindowReader(budget) for _ in seeds]
    workspaces = [Workspace(chunk_elems) for _ in range(max(1, threads))]
    with torch_threads(1), ThreadPoolExecutor(len(workspaces)) as pool:
        for t, pair in enumerate(reference):
            scope = by_module.setdefault(module_type(pair.name), _Counts(*shape))
            for start, stop in row_windows(pair.base.shape, window):
                wa = base_reader.rows(pair.base, start, stop)
                wfs = [r.rows(per_seed[s][t].final, start, stop) for s, r in enumerate(readers)]
                if cast_base_to_final and all(narrower_float(wf.dtype, wa.dtype) for wf in wfs):
                    wa = wa.to(wfs[0].dtype)
                spans = spans_of(wa.numel(), len(workspaces), chunk_elems)
                jobs = [
                    pool.submit(_overlap_span, wa[s:e], [wf[s:e] for wf in wfs], plan, ws, pairs)
                    for (s, e), ws in zip(spans, workspaces, strict=False)
                ]
                for job in jobs:
                    part = job.result()
                    total.add(part)
                    scope.add(part)
    base_reader.close()
    for r in readers:
        r.close()
    whole = _rows(total, seeds, pairs, plan.etas, precision)
    modules = [
        _rows(counts, seeds, pairs, plan.etas, precision).assign(module=module)
        for module, counts in sorted(by_module.items())
    ]
    by_mod = pd.concat(modules, ignore_index=True) if modules else pd.DataFrame(columns=[*COLUMNS, "module"])
    return whole, by_mod


def _overlap_span(
    a: torch.Tensor, finals: list[torch.Tensor], plan: EtaPlan, ws: Workspace, pairs: list[tuple[int, int]]
) -> _Counts:
    """Counts over one aligned span of the base and every seed's final, chunk by chunk."""
    out = _Counts(len(finals), len(pairs), len(plan.etas))
    buf = np.empty(ws.n, dtype=np.bool_)
    for k in range(0, a.numel(), ws.n):
        chunk = a[k : k + ws.n]
        n = chunk.numel()
        masks = [changed_masks(chunk, f[k : k + ws.n], plan, ws) for f in finals]
        changed = np.array([[np.count_nonzero(m) for m in seed] for seed in masks], dtype=np.int64)
        for p, (i, j) in enumerate(pairs):
            for e, (mi, mj) in enumerate(zip(masks[i], masks[j], strict=True)):
                inter = np.count_nonzero(np.logical_and(mi, mj, out=buf[:n]))
                out.inter[p, e] += inter
                out.union[p, e] += changed[i, e] + changed[j, e] - inter
        out.changed += changed
        out.numel += n
    return out


def _rows(
    counts: _Counts, seeds: list[int], pairs: list[tuple[int, int]], etas: Sequence[float], precision: str
) -> pd.DataFrame:
    rows = []
    n = counts.numel
    for p, (i, j) in enumerate(pairs):
        for e, eta in enumerate(etas):
            inter, union = int(counts.inter[p, e]), int(counts.union[p, e])
            da = counts.changed[i, e] / n if n else math.nan
            db = counts.changed[j, e] / n if n else math.nan
            jac = inter / union if union else math.nan
            chance = jaccard_chance(da, db)
            ratio = jac / chance if chance and not math.isnan(chance) else math.nan
            rows.append(
                {
                    "precision": precision,
                    "seed_a": seeds[i],
                    "seed_b": seeds[j],
                    "eta": float(eta),
                    "numel": n,
                    "intersection": inter,
                    "union": union,
                    "jaccard": jac,
                    "density_a": float(da),
                    "density_b": float(db),
                    "jaccard_chance": chance,
                    "ratio": ratio,
                }
            )
    frame = pd.DataFrame(rows, columns=COLUMNS)
    ints = ("seed_a", "seed_b", "numel", "intersection", "union")
    return frame.astype(dict.fromkeys(ints, "int64") | {"eta": "float64"})


def by_module_path(out: str | os.PathLike) -> Path:
    """results/sparsity/bf16/overlap.parquet -> results/sparsity/bf16/overlap.by_module.parquet."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".parquet") + ".by_module.parquet")


def run(
    base: str | os.PathLike,
    finals: Mapping[int, str | os.PathLike],
    precision: str,
    out: str | os.PathLike,
    by_module_out: str | os.PathLike | None = None,
    etas: Sequence[float] | None = None,
    threads: int = 1,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    cast_base_to_final: bool = True,
) -> pd.DataFrame:
    """The stage: seed-pair overlap of ``finals`` (seed -> model folder) into ``out`` (+ per module).

    ``cast_base_to_final`` defaults on in the workflow and the CLI alike (see sparsity.run).
    """
    log_startup(process_age_s())
    start = time.perf_counter()
    whole, by_mod = compute_overlap(
        base,
        finals,
        etas,
        precision,
        window_bytes=window_bytes,
        threads=threads,
        cast_base_to_final=cast_base_to_final,
    )
    write_parquet(out, whole)
    write_parquet(by_module_out or by_module_path(out), by_mod)
    if len(finals) < 2:
        print("overlap: fewer than two seeds, no pairs to compare", file=sys.stderr)
    for row in whole.itertuples():
        print(
            f"overlap {row.precision} seeds {row.seed_a},{row.seed_b} eta {row.eta:g}: "
            f"J={row.jaccard:.4g} chance={row.jaccard_chance:.4g} ratio={row.ratio:.3g}",
            file=sys.stderr,
        )
    print(f"overlap: {time.perf_counter() - start:.1f}s -> {out}", file=sys.stderr)
    return whole


def from_snakemake(smk) -> None:
    run(
        smk.input.base,
        dict(zip(map(int, smk.params.seeds), smk.input.finals, strict=True)),
        smk.wildcards.precision,
        smk.output.table,
        smk.output.by_module,
        etas=list(smk.params.etas),
        threads=smk.threads,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workflow_scripts.overlap",
        description="Cross-seed Jaccard overlap of changed-weight masks for one precision.",
    )
    p.add_argument("--base", required=True, help="base model folder, index json or .safetensors file")
    p.add_argument("--seeds", type=int, nargs="+", required=True, help="seed of each --finals entry")
    p.add_argument("--finals", nargs="+", required=True, help="fine-tuned model folders, one per seed")
    p.add_argument("--precision", required=True, help="precision label written to the 'precision' column")
    p.add_argument("--out", required=True, help="e.g. results/sparsity/bf16/overlap.parquet")
    p.add_argument("--by-module-out", help="per-module table (default: <out stem>.by_module.parquet)")
    add_diff_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.seeds) != len(args.finals):
        parser.error(f"--seeds has {len(args.seeds)} entries but --finals has {len(args.finals)}")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds has duplicates: {args.seeds}")
    run(
        args.base,
        dict(zip(args.seeds, args.finals, strict=True)),
        args.precision,
        args.out,
        args.by_module_out,
        **diff_options(args),
    )
    return 0


if __name__ == "__main__":
    main_from(globals())
