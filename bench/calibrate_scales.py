"""Calibration of the H2/H3 rule on both scales, on real runs: false "larger" under the null and detection
of planted seed effects of each form.

The verdicts read the off-task seed variance on two scales: absolute (dJ, KL) and matched drift
(dJ / sqrt(the arm's mean KL on the task), log KL; ``scopes.DRIFT_SCALES``). This script checks both on a
real metrics table, by the analysis's own model and rule (``verdicts.verdict_variance``):

- null: runs that compute the same thing (``--arm DIR:PRECISION``, repeatable, e.g. the default's fp32 and
  fp32_twin, or the twins of config.twins.yaml) are split at random into two labelled arms of ``--seeds``
  runs; the rate of "larger" (the rule's 'supported') must be at most alpha on every scale;
- planted: the same splits with arm A's seed deviations (on the scale being tested, around A's per-task
  mean) multiplied so that their variance is ``--ratio`` times larger, in three forms: ``whole`` (every
  run x task deviation), ``shared`` (the run's mean over tasks only: a seed effect shared by the tasks),
  ``task`` (the seed x task residual only); the rate of "larger" is the detection rate at that ratio;
- twins: with ``--twins DIR`` (a run of config.twins.yaml), every twin arm against the reference and
  against each other twin, the rule as the report applies it (one comparison each).

The splits share runs, so their outcomes are not independent: the intervals are a guide, not a bound.

    .venv/bin/python bench/calibrate_scales.py --arm results:fp32 --arm results:fp32_twin --seeds 8
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from null_splits import pooled_runs  # noqa: E402

from workflow_scripts import stats  # noqa: E402
from workflow_scripts.statistics import scopes as sc  # noqa: E402
from workflow_scripts.statistics import verdicts as vd  # noqa: E402

SCALES = {  # quantity of the model -> (what the verdict calls it, column it plants into)
    "dJ": "off-task dJ",
    "dJ_drift": "off-task dJ / sqrt(arm's KL)",
    "kl": "off-task KL",
    "log_kl": "off-task log KL",
}
FORMS = ("whole", "shared", "task")


def plant(rows: pd.DataFrame, col: str, ratio: float, form: str) -> pd.DataFrame:
    """Arm A's deviations of ``col`` from its per-task mean scaled by sqrt(ratio) in the given form."""
    rows = rows.copy()
    a = rows["precision"] == "A"
    wide = rows.loc[a].pivot_table(index="unit", columns="task", values=col)
    dev = wide - wide.mean(axis=0)
    shared = dev.mean(axis=1)
    task = dev.sub(shared, axis=0)
    k = np.sqrt(ratio)
    new_dev = {"whole": dev * k, "shared": task + np.outer(shared * k, np.ones(dev.shape[1])),
               "task": task * k + np.outer(shared, np.ones(dev.shape[1]))}[form]  # fmt: skip
    new = (wide.mean(axis=0) + new_dev).stack().rename("new").reset_index()
    merged = rows.loc[a, ["unit", "task"]].merge(new, on=["unit", "task"], how="left")
    rows.loc[a, col] = merged["new"].to_numpy()
    return rows


BOOTSTRAP: int | None = None  # --bootstrap: bootstrap tables and seed permutations per comparison


def outcome(rows: pd.DataFrame, q: str, ref: str, arm: str, key: str) -> str:
    cfg = {**stats.analysis_defaults(), **({"bootstrap": BOOTSTRAP} if BOOTSTRAP else {})}
    tasks = sorted(rows["task"].unique())
    block = sc.model_scope(rows, tasks, [ref, arm], q, cfg, key, None)
    comp = (block.get("comparisons") or {}).get(arm) or {"status": "failed", "reason": block.get("reason")}
    return vd.verdict_variance(comp, {}, None, cfg, SCALES[q])[0]


def split_rows(pool: pd.DataFrame, rng: np.random.Generator, n: int) -> pd.DataFrame:
    chosen = rng.permutation(np.unique(pool["unit"]))[: 2 * n]
    label = {u: ("A" if j < n else "B") for j, u in enumerate(chosen)}
    rows = pool[pool["unit"].isin(chosen)].copy()
    rows["precision"], rows["seed"] = rows["unit"].map(label), rows["unit"]
    stats._drift_scales(rows)  # the dJ scale's divisor is the (relabelled) arm's mean KL
    return rows


def rate(got: list[str]) -> str:
    k, n = got.count("supported"), len(got)
    lo = st.beta.ppf(0.025, k, n - k + 1) if k else 0.0
    hi = st.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return f"{k}/{n} = {k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def twin_table(folder: Path, scales: list[str] | None = None) -> list[tuple[str, str, str, str]]:
    """(reference, arm, scale, verdict) of every ordered pair of the folder's fp32 arms (reference and
    twins: arms with no factor but their seeds), as the analysis computes one comparison."""
    rows = stats._prepare(pd.read_parquet(folder / "analysis" / "metrics.parquet"), [])[0]
    rows = rows[rows["role"] == "off_task"]
    arms = sorted(rows["precision"].unique())
    out = []
    for ref, arm in itertools.permutations(arms, 2):
        sub = rows[rows["precision"].isin([ref, arm])]
        for q in scales or SCALES:
            out.append((ref, arm, q, outcome(sub, q, ref, arm, f"twins/{ref}/{arm}/{q}")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arm", action="append", default=[], help="RESULTS_DIR:PRECISION (repeatable)")
    parser.add_argument("--seeds", type=int, default=8, help="runs per labelled arm")
    parser.add_argument("--splits", type=int, default=100)
    parser.add_argument("--ratio", type=float, default=4.0, help="planted variance ratio")
    parser.add_argument("--twins", type=Path, help="a results dir of config.twins.yaml")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scales", nargs="*", choices=list(SCALES), help="only these (default: all)")
    parser.add_argument(
        "--bootstrap",
        type=int,
        help="bootstrap tables = seed permutations per comparison (default: the "
        "analysis default); p resolves to 1/(N+1)",
    )
    parser.add_argument("--json", type=Path, help="write every outcome here too")
    args = parser.parse_args(argv)
    global BOOTSTRAP
    BOOTSTRAP = args.bootstrap
    record: dict = {}
    if args.arm:
        pool = pooled_runs(args.arm)
        rng = np.random.default_rng(args.seed)
        got: dict[str, list[str]] = {}
        for i in range(args.splits):
            rows = split_rows(pool, rng, args.seeds)
            for q in args.scales or SCALES:
                got.setdefault(f"null {q}", []).append(outcome(rows, q, "B", "A", f"null/{q}/{i}"))
                for form in FORMS:
                    planted = plant(rows, sc.MODEL_QUANTITIES[q][0], args.ratio, form)
                    name = f"{args.ratio:g}x {form} {q}"
                    got.setdefault(name, []).append(outcome(planted, q, "B", "A", f"{form}/{q}/{i}"))
        print(f"{pool['unit'].nunique()} distinct runs; {args.splits} splits of {args.seeds} vs {args.seeds}")
        print("| case | scale | rate of 'larger' [95% CI] |\n|---|---|---|")
        for name, outcomes in got.items():
            case, q = name.rsplit(" ", 1)
            print(f"| {case} | {SCALES[q]} | {rate(outcomes)} |")
        record["splits"] = got
    if args.twins:
        table = twin_table(args.twins, args.scales)
        print("\n| scale | twin pairs called larger | pairs |\n|---|---|---|")
        for q in args.scales or SCALES:
            got_q = [v for _, _, s, v in table if s == q]
            hits = [f"{a} vs {r}" for r, a, s, v in table if s == q and v == "supported"]
            print(f"| {SCALES[q]} | {rate(got_q)} | {', '.join(hits) or '-'} |")
        record["twins"] = table
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
