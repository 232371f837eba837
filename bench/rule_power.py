"""Does ``power.py`` predict what the shipped rule finds? Its simulated power of the whole H2/H3 rule
(profile bound, bootstrap, seed permutation, Holm's first step) against the rate of "larger" over
simulated metrics tables, each through the analysis itself (``scopes.model_scope`` with its bootstrap and
permutation, ``verdicts.verdict_variance``, and Holm over ``--family`` arms for an arm that is the only
real effect: ``family`` x its evidence p below alpha).

The tables are the calibration design of tests/test_stats.py (8 seeds, 4 off-task tasks, eval noise of
300 problems x 8 samples; shared = seed x task variance 1e-4), the arm's whole seed variance ``--ratios``
times the reference's, placed in the shared part, the seed x task part or both. Also printed: the power
of the profile bound alone (what the MDE rested on before the guards were simulated).

    .venv/bin/python bench/rule_power.py --tables 200 --ratios 4 9
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

import numpy as np
from scipy import stats as st

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workflow_scripts import stats  # noqa: E402
from workflow_scripts.statistics import power, scopes, simulation  # noqa: E402
from workflow_scripts.statistics import variance_model as vm  # noqa: E402
from workflow_scripts.statistics import verdicts as vd  # noqa: E402

SHARED = TASK = 1e-4
SEEDS, OFF = 8, 4
NOISE = {"n_problems": 300, "n_samples": 8}
ARMS = list(simulation.ARMS)


def table(rng: np.random.Generator, structure: str, ratio: float):
    seed_var, task_var = simulation.structure(structure, ratio, SHARED, TASK)
    return simulation.simulate_table(
        rng, n_seeds=SEEDS, n_off=OFF, seed_var=seed_var, task_var=task_var,
        shared_default=SHARED, task_default=TASK, **NOISE,
    )  # fmt: skip


def off_task_block(t, cfg: dict) -> dict:
    rows = stats._prepare(t, [])[0]
    tasks = sorted(rows.loc[rows["role"] == "off_task", "task"].unique())
    return scopes.model_scope(rows, tasks, ARMS, "dJ", cfg, "off_task", None)


def observed(blocks: list[dict], cfg: dict, family: int) -> tuple[float, float]:
    """(rate of 'larger' after Holm's first step over ``family``, rate as one comparison)."""
    single, fam = [], []
    for b in blocks:
        comp = b["comparisons"]["bf16"]
        larger = vd.verdict_variance(comp, {}, None, cfg, "off-task dJ")[0] == "supported"
        p = vd.evidence_p(comp, {})
        single.append(larger)
        fam.append(larger and p is not None and family * p < cfg["alpha"])
    return float(np.mean(fam)), float(np.mean(single))


def predicted(structure: str, ratio: float, cfg: dict, family: int, sims: int, rng) -> tuple[float, ...]:
    """(whole rule with Holm, whole rule as one comparison, profile bound alone) from power.py."""
    fa, fr, floor = fits(table(np.random.default_rng(1), "null", 1.0), cfg)
    seed_var, _ = simulation.structure(structure, ratio, SHARED, TASK)
    whole = SHARED + TASK
    null = vm.NullFit(whole, seed_var[("bf16", "off_task")] / (ratio * whole), SHARED / whole)
    fam, single = power.rule_power(null, ratio, fa, fr, SEEDS, cfg["alpha"], sims, rng, floor, family)
    pa, pr, _, _ = power._simulate(null, ratio, fa, fr, SEEDS, sims, rng, floor)
    lam, up = vm.lrt_stats(pa, pr)
    profile = float(np.mean(up & (lam > st.chi2.ppf(1 - 2 * cfg["alpha"], 1))))
    return fam, single, profile


def fits(t, cfg: dict):
    """The fits power.py takes its eval noise from (a null table of the design)."""
    rows = stats._prepare(t, [])[0]
    tasks = sorted(rows.loc[rows["role"] == "off_task", "task"].unique())
    datas = {a: scopes.arm_data_of(rows, a, tasks, "dJ", "noise") for a in ARMS}
    scale = vm.scale_of(*datas.values())
    grid, floor = vm.Grid.around(scale), scale * 1e-12
    fr, fa = (vm.fit_arm(datas[a], grid, floor) for a in ARMS)
    return fa, fr, floor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=200, help="simulated tables per (structure, ratio)")
    ap.add_argument("--ratios", type=float, nargs="+", default=[4.0, 9.0])
    ap.add_argument("--structures", nargs="+", default=["shared", "task", "both"])
    ap.add_argument("--family", type=int, default=4, help="arms Holm corrects over (the default's 4)")
    ap.add_argument("--bootstrap", type=int, default=400, help="bootstrap tables and permutations per table")
    ap.add_argument("--sims", type=int, default=400, help="power.py's simulations per prediction")
    args = ap.parse_args()
    cfg = {**stats.analysis_defaults(), "bootstrap": args.bootstrap, "power_simulations": 0}
    print(f"| structure | ratio | rule + Holm({args.family}): tables / power.py "
          "| rule, one comparison: tables / power.py | profile bound alone (power.py) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for structure in args.structures:
        for ratio in args.ratios:
            t0 = time.perf_counter()
            rng = np.random.default_rng(zlib.crc32(f"{structure}/{ratio:g}".encode()))  # str hash varies
            blocks = [off_task_block(table(rng, structure, ratio), cfg) for _ in range(args.tables)]
            fam_obs, single_obs = observed(blocks, cfg, args.family)
            fam, single, profile = predicted(structure, ratio, cfg, args.family, args.sims, rng)
            se = np.sqrt(max(single_obs * (1 - single_obs), 0.01) / args.tables)
            print(f"| {structure} | {ratio:g} | {fam_obs:.3f} / {fam:.3f} | {single_obs:.3f} / {single:.3f} "
                  f"(+-{1.96 * se:.3f}) | {profile:.3f} |", flush=True)  # fmt: skip
            print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
