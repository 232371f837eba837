"""How far a run's conclusions travel from its one base: the same experiment on several bases, pooled.

Every conclusion of a run is conditional on its base (one draw of the warm start). ``make bases``
(config.bases.yaml) repeats the default experiment on bases built from other warm-start seeds, one
folder per base; this module reads their stats.json files and puts the base in as a factor:

- each mean effect of the decomposition (every single-factor arm and every bundle against the
  reference, on-task dJ, off-task dJ, log off-task KL) per base, and pooled across the bases by a
  random-effects meta-analysis (statsmodels' ``combine_effects``, DerSimonian-Laird). The interval is
  Knapp-Hartung's, a t on k - 1 degrees of freedom (with 3 bases, a z interval would claim far more
  than 3 draws carry). ``tau`` is the between-base standard deviation of the effect: what a new base
  would add to it; Cochran's Q tests whether the bases agree beyond their own within-base noise;
- each variance verdict (H1-H3, per arm) of each base side by side, and how many bases say the same.

No sentence here goes beyond those numbers: "on every base" counts the bases whose own interval
excludes 0 on the pooled side. Pure but for ``main``.

    python -m workflow_scripts.statistics.across_bases results/bases/base-s*/results/analysis/stats.json \\
        --out results/bases/across_bases.md
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as st
from statsmodels.stats.meta_analysis import combine_effects

from workflow_scripts.runtime.atomic import write_json, write_text

QUANTITIES = ("on_task_dJ", "off_task_dJ", "off_task_log_kl")


def base_name(path: Path) -> str:
    """``results/bases/base-s2/results/analysis/stats.json`` -> ``base-s2`` (the folder above ``results``);
    a stats.json elsewhere is named by its own folder's path."""
    parts = path.resolve().parts
    if "results" in parts:
        i = len(parts) - 1 - parts[::-1].index("results")
        if i > 0:
            return parts[i - 1]
    return str(path.parent)


def load(paths: Sequence[str | Path]) -> dict[str, dict]:
    """{base name: stats.json} for each path; a missing or unreadable file, or one without a
    decomposition, is an error that names it."""
    out: dict[str, dict] = {}
    for raw in paths:
        path = Path(raw)
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise SystemExit(f"{path}: cannot read stats.json ({err})") from err
        block = result.get("decomposition") if isinstance(result, dict) else None
        if not isinstance(block, dict) or block.get("status") != "ok":
            why = (block or {}).get("reason") if isinstance(block, dict) else "absent"
            raise SystemExit(f"{path}: field 'decomposition' is not usable ({why})")
        name = base_name(path)
        if name in out:
            raise SystemExit(f"{path}: a second stats.json of base {name!r}")
        out[name] = result
    if len(out) < 2:
        raise SystemExit(f"{len(out)} base(s): pooling across bases needs at least 2 stats.json files")
    return out


def effect_rows(by_base: Mapping[str, dict]) -> pd.DataFrame:
    """One row per (base, arm, quantity): the arm's effect against the reference on that base (the
    decomposition's main effect, or a bundle's whole effect), its mean, SE and seeds."""
    rows = []
    for base, result in by_base.items():
        block = result["decomposition"]
        entries = [(arm, e.get("effect") or arm, e) for arm, e in (block.get("main_effects") or {}).items()]
        for arm, b in (block.get("bundles") or {}).items():
            whole = (
                {q: (b.get(q) or {}).get("bundle") for q in QUANTITIES}
                if b.get("status") == "ok"
                else b.get("whole")
            )
            entries.append((arm, " + ".join(b.get("effects") or [arm]), whole or {}))
        for arm, effect, values in entries:
            for q in QUANTITIES:
                c = values.get(q) or {}
                if c.get("status") == "ok":
                    row = {"base": base, "arm": arm, "effect": effect, "quantity": q}
                    rows.append(row | {"mean": float(c["mean"]), "se": float(c["se"]), "n": int(c["n"])})
    return pd.DataFrame(rows, columns=["base", "arm", "effect", "quantity", "mean", "se", "n"])


def pool_one(means: np.ndarray, ses: np.ndarray, alpha: float) -> dict[str, Any]:
    """Random-effects pooling of one effect over k bases (DerSimonian-Laird tau^2, Knapp-Hartung t CI)."""
    k = len(means)
    if k < 2:
        return {"status": "skipped", "reason": f"{k} base(s)"}
    if np.any(ses <= 0):  # a flat arm (every seed equal): no within-base noise to weight it by
        return {"status": "skipped", "reason": "an effect with SE 0 on some base"}
    res = combine_effects(means, ses**2, method_re="dl", alpha=alpha)
    mean, se = float(res.mean_effect_re), float(res.sd_eff_w_re_hksj)
    half = float(st.t.ppf(1 - alpha / 2, k - 1)) * se
    q, df = float(res.q), k - 1
    return {
        "status": "ok",
        "k": k,
        "mean": mean,
        "ci": [mean - half, mean + half],
        "tau": math.sqrt(max(float(res.tau2), 0.0)),
        "i2": float(res.i2) if np.isfinite(res.i2) else 0.0,
        "q": q,
        "q_p": float(st.chi2.sf(q, df)),
    }


def pool(rows: pd.DataFrame, alpha: float = 0.05) -> list[dict[str, Any]]:
    """Per (arm, quantity): the per-base effects and their pooled estimate; ``every_base`` counts the
    bases whose own (1 - alpha) t interval excludes 0 on the pooled estimate's side."""
    out = []
    for (arm, q), g in rows.groupby(["arm", "quantity"], sort=False):
        g = g.sort_values("base")
        means, ses = g["mean"].to_numpy(), g["se"].to_numpy()
        pooled = pool_one(means, ses, alpha)
        sign = math.copysign(1.0, pooled.get("mean", 0.0))
        half = st.t.ppf(1 - alpha / 2, np.maximum(g["n"].to_numpy() - 1, 1)) * ses
        clear = int(np.sum(sign * means - half > 0)) if pooled["status"] == "ok" else 0
        out.append({"arm": arm, "effect": g["effect"].iloc[0], "quantity": q,
                    "by_base": dict(zip(g["base"], map(float, means), strict=True)),
                    "pooled": pooled, "same_side": clear, "bases": len(g)})  # fmt: skip
    return out


def verdict_table(by_base: Mapping[str, dict]) -> list[dict[str, Any]]:
    """Per (hypothesis, arm): each base's verdict word and how many bases share the commonest."""
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for base, result in by_base.items():
        for h, v in (result.get("verdicts") or {}).items():
            for arm, a in (v.get("by_arm") or {}).items():
                cells.setdefault((h, arm), {})[base] = a.get("verdict", "?")
    rows = []
    for (h, arm), words in cells.items():
        word, count = Counter(words.values()).most_common(1)[0]
        rows.append({"hypothesis": h, "arm": arm, "by_base": words, "commonest": word, "agree": count})
    return rows


def _fmt(x: float) -> str:
    return f"{x:+.3g}"


def render(
    by_base: Mapping[str, dict], pooled: Sequence[dict], verdicts: Sequence[dict], alpha: float
) -> str:
    bases = list(by_base)
    ref = {r["decomposition"].get("reference") for r in by_base.values()}
    lines = [
        "# Across bases",
        "",
        f"{len(bases)} bases ({', '.join(bases)}), the same experiment on each; reference arm "
        f"{', '.join(sorted(map(str, ref)))}. Each effect is the arm's mean against the reference on that "
        "base; "
        f"pooled: random effects (DerSimonian-Laird), {100 * (1 - alpha):g}% Knapp-Hartung t interval on "
        "k - 1 df; tau: the between-base SD of the effect (what another base adds); Q p: Cochran's test "
        "that the bases agree within their own noise; same side: bases whose own interval excludes 0 on "
        "the pooled estimate's side.",
        "",
        "## Mean effects",
        "",
        "| arm | effect | quantity | " + " | ".join(bases) + " | pooled [CI] | tau | Q p | same side |",
        "|---|---|---|" + "---|" * len(bases) + "---|---|---|---|",
    ]
    for row in pooled:
        p = row["pooled"]
        per = [_fmt(row["by_base"][b]) if b in row["by_base"] else "-" for b in bases]
        if p["status"] == "ok":
            q_p = f"{p['q_p']:.3g}" if p["q_p"] >= 1e-16 else "<1e-16"
            tail = [f"{_fmt(p['mean'])} [{_fmt(p['ci'][0])}, {_fmt(p['ci'][1])}]", f"{p['tau']:.3g}", q_p,
                    f"{row['same_side']} of {row['bases']}"]  # fmt: skip
        else:
            tail = [f"not pooled ({p['reason']})", "-", "-", "-"]
        lines.append(
            f"| {row['arm']} | {row['effect']} | {row['quantity']} | " + " | ".join(per + tail) + " |"
        )
    head = "| hypothesis | arm | " + " | ".join(bases) + " | agree |"
    lines += ["", "## Variance verdicts per base", "", head, "|---|---|" + "---|" * len(bases) + "---|"]
    for row in verdicts:
        words = [row["by_base"].get(b, "-") for b in bases]
        agree = f"{row['agree']} of {len(bases)} {row['commonest']}"
        lines.append(f"| {row['hypothesis']} | {row['arm']} | " + " | ".join(words) + f" | {agree} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stats", nargs="+", help="each base's results/analysis/stats.json")
    parser.add_argument(
        "--out", required=True, help="the markdown table (a .json beside it holds the numbers)"
    )
    parser.add_argument("--alpha", type=float, help="default: the first base's analysis alpha")
    args = parser.parse_args(argv)
    by_base = dict(sorted(load(args.stats).items(), key=lambda kv: _natural(kv[0])))
    alpha = args.alpha or float(next(iter(by_base.values()))["decomposition"].get("alpha", 0.05))
    pooled, verdicts = pool(effect_rows(by_base), alpha), verdict_table(by_base)
    out = Path(args.out)
    write_text(out, render(by_base, pooled, verdicts, alpha))
    write_json(out.with_suffix(".json"), {"bases": list(by_base), "alpha": alpha, "effects": pooled,
                                          "verdicts": verdicts})  # fmt: skip
    print(f"{out}: {len(by_base)} bases, {len(pooled)} effects pooled")
    return 0


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


if __name__ == "__main__":
    raise SystemExit(main())
