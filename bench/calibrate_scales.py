"""Calibration of the H2/H3 rule on both scales, on real runs: false "larger" under the null and detection
of planted seed effects of each form.

The verdicts read the off-task seed variance on two scales: absolute (dJ, KL) and matched drift
(dJ / sqrt(the arm's mean KL on the task), log KL; ``scopes.DRIFT_SCALES``). This script checks both on a
real metrics table, by the analysis's own model and rule (``verdicts.verdict_variance``):

- null: runs that compute the same thing (``--arm DIR:PRECISION``, repeatable, e.g. the default's fp32 and
  fp32_twin, or the twins of config.twins.yaml) are split at random into two labelled arms of ``--seeds``
  runs; the rate of "larger" (the rule's 'supported') must be at most alpha on every scale;
- planted: the same splits with arm A's whole seed variance (on the scale being tested) made ``--ratio``
  times larger on every task, in three forms: ``whole`` (A's real deviations from its per-task mean
  scaled: their shape kept), ``shared`` (a normal seed effect shared by the tasks added), ``task`` (an
  independent normal seed x task effect added), each added effect of variance (ratio - 1) x the task's
  whole seed variance; the rate of "larger" is the detection rate at that ratio in that form;
- twin sets: with ``--twin-sets``, the pooled runs cut into disjoint sets of ``--seeds`` (in their order:
  one arm's seeds, then the next) and every ordered pair of sets compared: real null twins at that seed
  count;
- twins: with ``--twins DIR`` (a run of config.twins.yaml), every twin arm against the reference and
  against each other twin, the rule as the report applies it (one comparison each).

The splits share runs, so their outcomes are not independent: the intervals are a guide, not a bound.

    .venv/bin/python bench/calibrate_scales.py --arm results:fp32 --arm results:fp32_twin --seeds 12 \
        --twin-sets --jobs 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy loads BLAS: one thread per process (two processes with
    # two BLAS threads each spin against each other on 2 cores: measured here, several times slower)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats as st  # noqa: E402

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


def plant(rows: pd.DataFrame, col: str, ratio: float, form: str, rng: np.random.Generator) -> pd.DataFrame:
    """Arm A's whole seed variance of ``col`` made ``ratio`` times larger on every task, in one form:
    ``whole`` scales A's real deviations from its per-task mean by sqrt(ratio) (their shape kept);
    ``shared`` adds a normal seed effect shared by the tasks, ``task`` an independent one per task, of
    variance (ratio - 1) x the task's whole seed variance (across the table's runs, eval noise taken
    out), so the whole variance, what the rule compares, grows by ``ratio`` in each form."""
    rows = rows.copy()
    a = rows["precision"] == "A"
    wide = rows.loc[a].pivot_table(index="unit", columns="task", values=col)
    if form == "whole":
        new = wide.mean(axis=0) + (wide - wide.mean(axis=0)) * np.sqrt(ratio)
    else:
        ncol = sc.MODEL_QUANTITIES[QUANTITY_OF[col]][1]
        by_task = rows.groupby("task")
        whole = (by_task[col].var(ddof=1) - by_task[ncol].mean()).clip(lower=0.0)[wide.columns]
        z = rng.standard_normal((len(wide), 1 if form == "shared" else wide.shape[1]))
        new = wide + z * np.sqrt((ratio - 1.0) * whole.to_numpy())[None, :]
    new = new.stack().rename("new").reset_index()
    merged = rows.loc[a, ["unit", "task"]].merge(new, on=["unit", "task"], how="left")
    rows.loc[a, col] = merged["new"].to_numpy()
    return rows


QUANTITY_OF = {cols[0]: q for q, cols in sc.MODEL_QUANTITIES.items()}  # model column -> quantity
BOOTSTRAP: int | None = None  # --bootstrap: bootstrap tables and seed permutations per comparison


GUARDS = ("bound", "bootstrap", "permutation")  # the rule's three conditions for "larger" (--parts)


def compare(rows: pd.DataFrame, q: str, ref: str, arm: str, key: str) -> tuple[str, dict[str, bool]]:
    """(verdict, whether each of the rule's conditions holds alone): the one-sided (1 - alpha) profile
    bound above 1, the bootstrap p and the seed-permutation p below alpha (``verdicts.verdict_variance``
    says "larger" when all three do; a comparison without a permutation passes it, as in the rule)."""
    cfg = {**stats.analysis_defaults(), **({"bootstrap": BOOTSTRAP} if BOOTSTRAP else {})}
    tasks = sorted(rows["task"].unique())
    block = sc.model_scope(rows, tasks, [ref, arm], q, cfg, key, None)
    comp = (block.get("comparisons") or {}).get(arm) or {"status": "failed", "reason": block.get("reason")}
    verdict = vd.verdict_variance(comp, {}, None, cfg, SCALES[q])[0]
    alpha = float(cfg["alpha"])
    _, one_sided, p, _ = vd._bounds(comp, {})  # what verdict_variance reads, from the same helpers
    robust = vd.robust_check(comp)
    parts = {
        "bound": one_sided is not None and one_sided[0] is not None and one_sided[0] > 1,
        "bootstrap": p is not None and p < alpha,
        "permutation": robust is None or robust < alpha,
    }
    return verdict, parts


def outcome(rows: pd.DataFrame, q: str, ref: str, arm: str, key: str) -> str:
    return compare(rows, q, ref, arm, key)[0]


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
    return pair_outcomes(rows, sorted(rows["precision"].unique()), scales, "twins")


def pair_outcomes(
    rows: pd.DataFrame, arms: list[str], scales: list[str] | None, key: str
) -> list[tuple[str, str, str, str]]:
    """(reference, arm, scale, verdict) of every ordered pair of ``arms``, one comparison each."""
    out = []
    for ref, arm in itertools.permutations(arms, 2):
        sub = rows[rows["precision"].isin([ref, arm])]
        for q in scales or SCALES:
            out.append((ref, arm, q, outcome(sub, q, ref, arm, f"{key}/{ref}/{arm}/{q}")))
    return out


POOL: pd.DataFrame | None = None  # the pooled runs, shared with the worker processes (fork)


def split_outcomes(job: tuple[int, int, int, float, tuple[str, ...], bool, bool]) -> dict[str, list[str]]:
    """Every outcome of split ``i``: null and each planted form (none with ``null_only``) on every scale,
    and with ``parts`` each condition of the rule alone ("supported" where it holds), under
    "CASE [condition]" (its own generator, so a split's result does not depend on how the splits are
    shared among processes)."""
    i, seed, n, ratio, scales, null_only, parts = job
    assert POOL is not None
    rng = np.random.default_rng([seed, i])
    rows = split_rows(POOL, rng, n)
    got: dict[str, list[str]] = {}

    def record(case: str, table: pd.DataFrame, q: str) -> None:
        verdict, held = compare(table, q, "B", "A", f"{case}/{q}/{i}")
        got.setdefault(f"{case} {q}", []).append(verdict)
        for guard in GUARDS if parts else ():
            got.setdefault(f"{case} [{guard}] {q}", []).append("supported" if held[guard] else "not")

    for q in scales:
        record("null", rows, q)
        for form in () if null_only else FORMS:
            record(f"{ratio:g}x {form}", plant(rows, sc.MODEL_QUANTITIES[q][0], ratio, form, rng), q)
    return got


def twin_sets(
    pool: pd.DataFrame, n: int, scales: list[str] | None = None, units: np.ndarray | None = None
) -> list[tuple[str, str, str, str]]:
    """(reference, arm, scale, verdict) of every ordered pair of disjoint sets of ``n`` real runs (the
    pooled runs in their order: seeds of one arm, then the next; or cut from ``units`` in its order), as
    the analysis computes one comparison: each pair is a real null twin at ``n`` seeds."""
    units = np.unique(pool["unit"]) if units is None else units
    sets = {f"set{j + 1}": units[j * n : (j + 1) * n] for j in range(len(units) // n)}
    label = {u: name for name, us in sets.items() for u in us}
    rows = pool[pool["unit"].isin(label)].copy()
    rows["precision"], rows["seed"] = rows["unit"].map(label), rows["unit"]
    stats._drift_scales(rows)  # the dJ scale's divisor is each set's own mean KL
    return pair_outcomes(rows, list(sets), scales, "sets")


def partition_counts(job: tuple[int, int, int, tuple[str, ...]]) -> dict[str, int]:
    """Pairs called "larger" per scale among the twin sets of random partition ``i`` of the pooled runs:
    what the real seed sets' count is under exchangeable runs (sets cut from a shuffled order)."""
    i, seed, n, scales = job
    assert POOL is not None
    order = np.random.default_rng([seed, i, 1]).permutation(np.unique(POOL["unit"]))
    table = twin_sets(POOL, n, list(scales), order)
    return {q: sum(v == "supported" for _, _, s, v in table if s == q) for q in scales}


def _print_partitions(observed: list[tuple[str, str, str, str]], counts: list[dict[str, int]]) -> None:
    pairs = sum(1 for _, _, s, _ in observed if s == next(iter(counts[0])))
    print(f"\n| scale | real seed sets: pairs called larger | {len(counts)} random partitions: mean "
          "[5%, 50%, 95%] | share of partitions >= the real sets |\n|---|---|---|---|")  # fmt: skip
    for q in counts[0]:
        got = sum(v == "supported" for _, _, s, v in observed if s == q)
        c = np.array([part[q] for part in counts])
        lo, mid, hi = np.quantile(c, [0.05, 0.5, 0.95])
        print(f"| {SCALES[q]} | {got}/{pairs} | {c.mean():.1f} = {c.mean() / pairs:.3f} of {pairs} "
              f"[{lo:g}, {mid:g}, {hi:g}] | {(c >= got).mean():.2f} |")  # fmt: skip


def _print_twins(table: list[tuple[str, str, str, str]], scales: list[str] | None, what: str) -> None:
    print(f"\n| scale | {what} called larger | pairs |\n|---|---|---|")
    for q in scales or SCALES:
        got_q = [v for _, _, s, v in table if s == q]
        hits = [f"{a} vs {r}" for r, a, s, v in table if s == q and v == "supported"]
        print(f"| {SCALES[q]} | {rate(got_q)} | {', '.join(hits) or '-'} |")


def run_jobs(fn, jobs: list, processes: int, chunksize: int) -> list:
    """``fn`` over ``jobs`` in order: in ``processes`` forked processes (they share POOL), or here."""
    if processes <= 1:
        return [fn(job) for job in jobs]
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as ex:
        return list(ex.map(fn, jobs, chunksize=chunksize))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arm", action="append", default=[], help="RESULTS_DIR:PRECISION (repeatable)")
    parser.add_argument("--seeds", type=int, default=8, help="runs per labelled arm")
    parser.add_argument("--splits", type=int, default=100)
    parser.add_argument("--ratio", type=float, default=4.0, help="planted variance ratio")
    parser.add_argument("--twins", type=Path, help="a results dir of config.twins.yaml")
    parser.add_argument(
        "--twin-sets",
        action="store_true",
        help="also every ordered pair of disjoint --seeds sets of the --arm runs",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--null-only", action="store_true", help="no planted effects (null splits only)")
    parser.add_argument("--jobs", type=int, default=1, help="processes (one thread each)")
    parser.add_argument("--scales", nargs="*", choices=list(SCALES), help="only these (default: all)")
    parser.add_argument(
        "--bootstrap",
        type=int,
        help="bootstrap tables = seed permutations per comparison (default: the "
        "analysis default); p resolves to 1/(N+1)",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="also each condition of the rule alone (bound, bootstrap, permutation)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="with --twin-sets: also this many random partitions of the runs into sets (the count of "
        "pairs called larger that exchangeable runs give)",
    )
    parser.add_argument("--json", type=Path, help="write every outcome here too")
    args = parser.parse_args(argv)
    global BOOTSTRAP, POOL
    BOOTSTRAP = args.bootstrap
    record: dict = {}
    scales = tuple(args.scales or SCALES)
    if args.arm:
        POOL = pooled_runs(args.arm)
        jobs = [
            (i, args.seed, args.seeds, args.ratio, scales, args.null_only, args.parts)
            for i in range(args.splits)
        ]
        parts = run_jobs(split_outcomes, jobs, args.jobs, chunksize=4)
        got: dict[str, list[str]] = {}
        for part in parts:
            for name, outcomes in part.items():
                got.setdefault(name, []).extend(outcomes)
        n_runs = POOL["unit"].nunique()
        print(f"{n_runs} distinct runs; {args.splits} splits of {args.seeds} vs {args.seeds}")
        print("| case | scale | rate of 'larger' [95% CI] |\n|---|---|---|")
        for name, outcomes in got.items():
            case, q = name.rsplit(" ", 1)
            print(f"| {case} | {SCALES[q]} | {rate(outcomes)} |")
        record["splits"] = got
        if args.twin_sets:
            sets = twin_sets(POOL, args.seeds, args.scales)
            _print_twins(sets, args.scales, f"pairs of the {n_runs // args.seeds} sets of {args.seeds} runs")
            record["twin_sets"] = sets
            if args.partitions:
                part_jobs = [(i, args.seed, args.seeds, scales) for i in range(args.partitions)]
                counts = run_jobs(partition_counts, part_jobs, args.jobs, chunksize=1)
                _print_partitions(sets, counts)
                record["partitions"] = counts
    if args.twins:
        table = twin_table(args.twins, args.scales)
        _print_twins(table, args.scales, "twin pairs")
        record["twins"] = table
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
