"""False-positive rate of the H2/H3 rule on real runs: random splits of runs of one and the same arm.

A negative control (an arm that is fp32 under another name and other seeds) must not read "supported".
One control run gives one draw of that event; this script gives its rate. It pools runs that compute the
same thing (``--arm DIR:PRECISION``, repeatable: e.g. the default's fp32 seeds and the controls' fp32_twin
seeds; a run present in two folders, bit-identical, counts once), draws ``--splits`` random pairs of
disjoint sets of ``--seeds`` runs, labels them as two arms and applies the analysis's own mixed model and
verdict rule (off-task dJ for H2, off-task KL for H3) to each pair. Under a calibrated test the rate of
"supported" is at most alpha. The splits share runs, so the pairs are not independent: the binomial
interval printed is a guide, not a bound.

    .venv/bin/python bench/null_splits.py --arm /tmp/e1/results:fp32 --arm /tmp/c1/results:fp32_twin
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from workflow_scripts import stats
from workflow_scripts.statistics import scopes as sc
from workflow_scripts.statistics import verdicts as vd
from workflow_scripts.stats import analysis_defaults

FINGERPRINT = ["task", "dJ", "kl"]  # a run's identity across folders: the same numbers on every task


def pooled_runs(arms: list[str]) -> pd.DataFrame:
    """Off-task rows of the named runs, one ``unit`` per distinct run (duplicates across folders dropped)."""
    frames, seen = [], set()
    for spec in arms:
        folder, precision = spec.rsplit(":", 1)
        # the analysis's own columns: eval noise (noise) and the KL estimator it reads with its noise
        rows = stats._prepare(pd.read_parquet(Path(folder) / "analysis" / "metrics.parquet"), [])[0]
        rows = rows[(rows["precision"] == precision) & (rows["role"] == "off_task")]
        if rows.empty:
            raise SystemExit(f"{folder}: no off-task rows of arm {precision!r}")
        for _, run in rows.groupby("seed"):
            key = tuple(map(tuple, run.sort_values("task")[FINGERPRINT].round(12).to_numpy()))
            if key not in seen:
                seen.add(key)
                frames.append(run.assign(unit=len(seen)))
    return pd.concat(frames, ignore_index=True)


def split_verdicts(
    pool: pd.DataFrame, n_seeds: int, splits: int, seed: int, bootstrap: int | None = None
) -> dict[str, list[str]]:
    """H2 (dJ) and H3 (KL) outcomes of ``splits`` random disjoint pairs of ``n_seeds`` runs each, by the
    analysis's rule (``dJ``, ``kl``) and by the rule before its seed-permutation check, the bootstrap's p
    alone (``dJ_model_alone``, ``kl_model_alone``); ``bootstrap``: the rule's bootstrap tables and seed
    permutations per comparison (default: the analysis default)."""
    cfg = {**analysis_defaults(), **({"bootstrap": bootstrap} if bootstrap else {})}
    rng = np.random.default_rng(seed)
    units = np.unique(pool["unit"])
    if len(units) < 2 * n_seeds:
        raise SystemExit(f"{len(units)} distinct runs; two disjoint sets of {n_seeds} need {2 * n_seeds}")
    tasks = sorted(pool["task"].unique())
    out: dict[str, list[str]] = {"dJ": [], "kl": [], "dJ_model_alone": [], "kl_model_alone": []}
    for i in range(splits):
        chosen = rng.permutation(units)[: 2 * n_seeds]
        label = {u: ("A" if j < n_seeds else "B") for j, u in enumerate(chosen)}
        rows = pool[pool["unit"].isin(chosen)].copy()
        rows["precision"] = rows["unit"].map(label)
        rows["seed"] = rows["unit"]
        for q, what in (("dJ", "off-task dJ"), ("kl", "off-task KL")):
            block = sc.model_scope(rows, tasks, ["B", "A"], q, cfg, f"null/{q}/{i}", None)
            comp = (block.get("comparisons") or {}).get("A") or {"status": "failed"}
            alone = {k: v for k, v in comp.items() if k != "permutation"}  # the bootstrap's p alone
            out[q].append(vd.verdict_variance(comp, {}, None, cfg, what)[0])
            out[f"{q}_model_alone"].append(vd.verdict_variance(alone, {}, None, cfg, what)[0])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arm", action="append", required=True, help="RESULTS_DIR:PRECISION (repeatable)")
    parser.add_argument("--seeds", type=int, default=8, help="runs per labelled arm")
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the outcomes here too")
    args = parser.parse_args(argv)
    pool = pooled_runs(args.arm)
    outcomes = split_verdicts(pool, args.seeds, args.splits, args.seed)
    print(f"{pool['unit'].nunique()} distinct runs; {args.splits} splits of {args.seeds} vs {args.seeds}")
    print("| quantity | supported | inconclusive | contradicted | rate of supported [95% Clopper-Pearson] |")
    print("|---|---|---|---|---|")
    for q, got in outcomes.items():
        k, n = got.count("supported"), len(got)
        lo = st.beta.ppf(0.025, k, n - k + 1) if k else 0.0
        hi = st.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
        print(f"| {q} | {k} | {got.count('inconclusive')} | {got.count('contradicted')} | "
              f"{k / n:.3f} [{lo:.3f}, {hi:.3f}] |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(outcomes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
