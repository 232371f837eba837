"""The shipped rule's false "larger" rate with a 16-seed reference, on real fp32 runs.

The default compares every arm with a reference of 16 seeds (config.yaml: precisions.fp32.seeds); the
arms have 8. Under the null an arm is the reference under another name, so the rule (the mixed model's
whole seed-variance ratio and its conditions, ``verdicts.verdict_variance``: H2 on the off-task dJ, H3
on the off-task KL) must call it "larger" ("supported") in at most alpha of the experiments. This script
measures that on real runs: it pools the distinct runs of arms that compute the same thing
(``--arm RESULTS_DIR:PRECISION``, repeatable, e.g. config.twins.yaml's fp32 and its five twins and the
default's fp32; a run present in two folders counts once), deals them into disjoint configurations of
16 reference runs + 8 "arm" runs (``--reference``, ``--arm-seeds``), and applies the rule to each. The
configurations share no run, so their outcomes are independent and the Clopper-Pearson interval is
exact for the rate (the claim needs >= 5 configurations: 120 runs; ``--min-configurations``).
``--partitions K`` repeats the deal K times with other shuffles (configurations then overlap between
deals): a steadier point estimate, whose interval is a guide only.

    .venv/bin/python bench/false_larger_16.py --arm /tmp/t1/results:fp32 --arm /tmp/t1/results:fp32_twin \\
        --arm /tmp/t1/results:fp32_twin2 ... --partitions 20
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from null_splits import pooled_runs

from workflow_scripts.statistics import scopes as sc
from workflow_scripts.statistics import verdicts as vd
from workflow_scripts.stats import analysis_defaults

QUANTITIES = {"dJ": "off-task dJ", "kl": "off-task KL"}  # H2, H3
LARGER = "supported"  # the verdict word of a "larger" seed variance (H2/H3: the arm varies more)


def configurations(units: np.ndarray, reference: int, arm: int, rng: np.random.Generator) -> list[tuple]:
    """Disjoint (reference units, arm units) sets from one shuffle of ``units``: as many as fit."""
    order = rng.permutation(units)
    size = reference + arm
    return [
        (order[i : i + reference], order[i + reference : i + size])
        for i in range(0, len(order) - size + 1, size)
    ]


def outcome(pool: pd.DataFrame, ref_units, arm_units, cfg: dict, key: str) -> dict[str, str]:
    """The rule's verdict on each quantity for one configuration (the arm labelled A, the reference R)."""
    label = {**{u: "R" for u in ref_units}, **{u: "A" for u in arm_units}}
    rows = pool[pool["unit"].isin(label)].copy()
    rows["precision"], rows["seed"] = rows["unit"].map(label), rows["unit"]
    tasks = sorted(rows["task"].unique())
    out = {}
    for q, what in QUANTITIES.items():
        block = sc.model_scope(rows, tasks, ["R", "A"], q, cfg, f"{key}/{q}", None)
        comp = (block.get("comparisons") or {}).get("A") or {
            "status": "failed",
            "reason": block.get("reason"),
        }
        out[q] = vd.verdict_variance(comp, {}, None, cfg, what)[0]
    out["either"] = LARGER if LARGER in (out["dJ"], out["kl"]) else "not larger"
    return out


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    a = 1 - level
    lo = float(st.beta.ppf(a / 2, k, n - k + 1)) if k else 0.0
    hi = float(st.beta.ppf(1 - a / 2, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def measure(pool: pd.DataFrame, reference: int, arm: int, partitions: int, seed: int, cfg: dict) -> dict:
    """{"first": outcomes of the first deal (disjoint), "all": outcomes of every deal, "configurations"}."""
    rng = np.random.default_rng(seed)
    units = np.unique(pool["unit"])
    deals = [configurations(units, reference, arm, rng) for _ in range(partitions)]
    outcomes = [
        [outcome(pool, r, a, cfg, f"false16/{d}/{i}") for i, (r, a) in enumerate(deal)]
        for d, deal in enumerate(deals)
    ]
    return {
        "configurations": len(deals[0]),
        "first": outcomes[0],
        "all": [o for deal in outcomes for o in deal],
    }


def rates(outcomes: list[dict[str, str]]) -> dict[str, dict]:
    out = {}
    for q in (*QUANTITIES, "either"):
        k, n = sum(o[q] == LARGER for o in outcomes), len(outcomes)
        out[q] = {
            "larger": k,
            "n": n,
            "rate": k / n if n else None,
            "ci95": list(clopper_pearson(k, n)) if n else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arm", action="append", required=True, help="RESULTS_DIR:PRECISION (repeatable)")
    parser.add_argument("--reference", type=int, default=16, help="reference runs per configuration")
    parser.add_argument("--arm-seeds", type=int, default=8, help="arm runs per configuration")
    parser.add_argument(
        "--partitions", type=int, default=1, help="deals of the pool (the first is reported exact)"
    )
    parser.add_argument("--min-configurations", type=int, default=5)
    parser.add_argument(
        "--bootstrap", type=int, help="the rule's bootstrap resamples (default: the config's)"
    )
    parser.add_argument(
        "--null-splits",
        type=int,
        help="reference splits of the null yardstick each comparison reports (default: the config's; the "
        "rule does not read it)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the rates and outcomes here too")
    args = parser.parse_args(argv)
    pool = pooled_runs(args.arm)
    n_units, size = pool["unit"].nunique(), args.reference + args.arm_seeds
    if n_units // size < args.min_configurations:
        raise SystemExit(
            f"{n_units} distinct runs make {n_units // size} disjoint configurations of {args.reference} + "
            f"{args.arm_seeds}; --min-configurations {args.min_configurations} needs "
            f"{args.min_configurations * size}"
        )
    cfg = {
        **analysis_defaults(),
        **({"bootstrap": args.bootstrap} if args.bootstrap else {}),
        **({"null_splits": args.null_splits} if args.null_splits else {}),
    }
    result = measure(pool, args.reference, args.arm_seeds, args.partitions, args.seed, cfg)
    first, every = rates(result["first"]), rates(result["all"])
    print(
        f"{n_units} distinct runs; {result['configurations']} disjoint configurations of {args.reference} "
        f"reference + {args.arm_seeds} arm runs; alpha {cfg['alpha']}"
    )
    print("| quantity | larger / configurations (one deal, disjoint) | rate [95% Clopper-Pearson] | "
          f"rate over {args.partitions} deal(s) |")  # fmt: skip
    print("|---|---|---|---|")
    for q, r in first.items():
        lo, hi = r["ci95"]
        rate = f"{r['rate']:.3f} [{lo:.3f}, {hi:.3f}]"
        print(f"| {q} | {r['larger']} / {r['n']} | {rate} | {every[q]['rate']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"disjoint": first, "all_deals": every, **result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
