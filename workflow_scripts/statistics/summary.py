""" "What this run says": the report's first paragraph, 3-8 sentences generated from stats.json, and from
the mismatch table's per-arm gaps where the report passes them (``mismatch_report.gaps_by_arm``).

Sentences, in order, each present only where stats.json has its numbers:

| sentence       | from                            | says                                                |
|----------------|---------------------------------|-----------------------------------------------------|
| arms           | ``arms``, the gaps              | what each arm is against the reference, in factors, |
|                |                                 | and where its sampler-trainer gap comes from        |
| gate           | ``gate``                        | whether training worked (else nothing is testable)  |
| largest effect | ``decomposition``               | the largest on-task mean effect with its interval;  |
|                |                                 | for a bundle, the factor that carries it            |
| variance       | ``verdicts`` H2 / H3 ``by_arm`` | each finding (larger / smaller / not larger than    |
|                |                                 | r0) with the null twin's ratio beside it            |
| scales         | ``by_arm[..].matched_drift``    | where the absolute and matched-drift scales         |
|                |                                 | disagree (one sentence for all arms)                |
| caution        | findings                        | what not to conclude (an arm that moves less...)    |
| controls       | ``controls``                    | whether the null twin stayed "not larger"           |

The report also takes its arm table (``arms_section``) and decomposition table
(``decomposition_section``) from here: the three read the same blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflow_scripts.statistics.mismatch_report import gap_words
from workflow_scripts.statistics.report_tables import ci, fmt, get, table

QUANTITY_WORDS = {"H2": "off-task dJ", "H3": "off-task KL"}
KIND_WORDS = {"null twin": "a null twin", "bundle": "a bundle"}  # an arm's kind, said after its factors


def _signed(x: Any) -> str:
    s = fmt(x)
    return s if s.startswith("-") or s == "n/a" else "+" + s


def _effect(c: Mapping | None) -> str:
    if not c or c.get("status") != "ok":
        return "n/a"
    return f"{_signed(c['mean'])} {ci(c['ci'])}"


def arms_sentence(stats: Mapping, gaps: Mapping[str, Mapping] | None = None) -> str | None:
    """Each arm in factors against the reference; with ``gaps`` (arm -> ``gaps_by_arm`` entry), where an
    arm's sampler-trainer gap comes from, so a gap from dropout is not read as a precision effect."""
    arms = stats.get("arms") or {}
    ref = stats.get("reference")
    if not arms or ref not in arms:
        return None
    d = arms[ref].get("description") or {}
    parts = []
    for arm, block in arms.items():
        if arm == ref:
            continue
        kind = block.get("kind")
        if kind == "unknown":
            parts.append(f"{arm} = (no config entry)")
            continue
        twin = kind == "null twin"
        what = f"{ref} again with other seeds" if twin else " + ".join(block.get("effects") or [])
        notes = [KIND_WORDS.get(kind), gap_words((gaps or {}).get(arm))]
        notes = [n for n in notes if n]
        parts.append(f"{arm} = {what}" + (f" ({'; '.join(notes)})" if notes else ""))
    ref_gap = gap_words((gaps or {}).get(ref))
    head = (
        f"Arms, each against the reference {ref} ({d.get('masters', 'n/a')} masters, dropout "
        f"{d.get('dropout', 'n/a')}{'; ' + ref_gap if ref_gap else ''})"
    )
    return f"{head}: " + "; ".join(parts) + "." if parts else None


def gate_sentence(stats: Mapping) -> str:
    g = stats.get("gate") or {}
    if g.get("passed"):
        return (
            f"Training worked: {g.get('arm')}'s on-task dJ is {_signed(g.get('mean'))} ± "
            f"{fmt(g.get('se'), 2)} (SE, {g.get('n_seeds')} seeds), so the comparisons below are tested."
        )
    return (
        f"Training did not improve the on-task score ({g.get('reason') or 'no reference arm'}): every "
        "verdict is 'not testable' and the numbers below only describe the runs."
    )


def largest_effect_sentence(stats: Mapping) -> str | None:
    """The largest on-task mean effect among bundles and single-factor arms; a bundle's split into parts."""
    dec = stats.get("decomposition") or {}
    if dec.get("status") != "ok":
        return None
    cands: list[tuple[float, str, Mapping]] = []
    for arm, b in (dec.get("bundles") or {}).items():
        c = get(b, "on_task_dJ", "bundle")
        if b.get("status") == "ok" and c and c.get("status") == "ok":
            cands.append((abs(c["mean"]), arm, c))
    for arm, m in (dec.get("main_effects") or {}).items():
        c = m.get("on_task_dJ")
        if c and c.get("status") == "ok":
            cands.append((abs(c["mean"]), arm, c))
    if not cands:
        return None
    _, arm, c = max(cands, key=lambda x: x[0])
    ref = dec.get("reference")
    text = f"The largest on-task effect is {arm}'s: dJ {_effect(c)} against {ref}"
    bundle = (dec.get("bundles") or {}).get(arm)
    if bundle and bundle.get("status") == "ok":
        q = bundle["on_task_dJ"]
        main = dec.get("main_effects") or {}
        parts = [f"{main[a]['effect']} ({a}) {_effect(pc)}" for a, pc in q["parts"].items()]
        inter = q["interaction"]
        top = q.get("largest_part")
        carrier = f"{main[top]['effect']} carries the most" if top else "no part carries it"
        added = (
            "the parts add up"
            if inter.get("status") == "ok" and inter["p"] >= stats_alpha(stats)
            else ("the parts do not simply add")
        )
        text += f"; taken apart: {'; '.join(parts)}; interaction {_effect(inter)}: {carrier} and {added}"
    elif arm in (dec.get("main_effects") or {}):
        text += f", from {dec['main_effects'][arm]['effect']} alone"
    if c["ci"][0] < 0 < c["ci"][1]:
        text += " (its interval contains 0: no arm changes the on-task mean detectably)"
    return text + "."


def stats_alpha(stats: Mapping) -> float:
    return float(get(stats, "config", "alpha") or 0.05)


def _ratio(stats: Mapping, h: str, arm: str) -> str:
    q = "dJ" if h == "H2" else "kl"
    comp = get(stats, "mixed_model", "off_task", q, "comparisons", arm) or {}
    return f"{fmt(comp.get('ratio'))}x {ci(comp.get('ratio_ci'))}" if comp.get("status") == "ok" else "n/a"


def variance_sentences(stats: Mapping) -> list[str]:
    """One sentence per hypothesis (H2, H3): each arm's finding, its ratio, and the null twin's ratio."""
    out = []
    for h in ("H2", "H3"):
        by_arm = get(stats, "verdicts", h, "by_arm") or {}
        if not by_arm or all(v.get("verdict") == "not testable" for v in by_arm.values()):
            continue
        items = [f"{v.get('finding')} for {a} ({_ratio(stats, h, a)})" for a, v in by_arm.items()]
        twins = next((v.get("twins") for v in by_arm.values() if v.get("twins")), None) or {}
        twin = "; ".join(f"the null twin {t} gets {fmt(x.get('ratio'))}x {ci(x.get('ratio_ci'))}"
                         for t, x in twins.items())  # fmt: skip
        out.append(
            f"Seed variance of {QUANTITY_WORDS[h]} against the reference ({h}, absolute scale): "
            + "; ".join(items)
            + (f"; beside them {twin}" if twin else "")
            + "."
        )
    return out


def scale_sentence(stats: Mapping) -> str | None:
    """One sentence: where the absolute and matched-drift scales disagree, or where 'smaller' holds only
    in absolute terms."""
    clauses = []
    for h in ("H2", "H3"):
        for arm, v in (get(stats, "verdicts", h, "by_arm") or {}).items():
            drift = v.get("matched_drift") or {}
            if not drift:
                continue
            d = f"{drift.get('scale')} ratio {fmt(drift.get('ratio'))}x {ci(drift.get('ratio_ci'))}"
            if v.get("scales_agree") is False:
                clauses.append(
                    f"{arm}'s {QUANTITY_WORDS[h]} is {v.get('finding')} in absolute terms but "
                    f"{drift.get('finding')} at matched drift ({d})"
                )
            elif v.get("finding") == "smaller" and drift.get("finding") != "smaller":
                clauses.append(
                    f"{arm}'s {QUANTITY_WORDS[h]} is smaller only in absolute terms, {drift.get('finding')} "
                    f"at matched drift ({d})"
                )
    return ("The scales disagree: " + "; ".join(clauses) + ".") if clauses else None


def caution_sentence(stats: Mapping) -> str | None:
    findings = [(a, v) for h in ("H2", "H3") for a, v in (get(stats, "verdicts", h, "by_arm") or {}).items()]
    smaller = sorted({a for a, v in findings if v.get("finding") == "smaller"})
    if not smaller:
        return None
    main = get(stats, "decomposition", "main_effects") or {}
    bundles = get(stats, "decomposition", "bundles") or {}
    learns_less = [
        a for a in smaller
        if (get(bundles, a, "on_task_dJ", "bundle") or get(main, a, "on_task_dJ") or {}).get("mean", 0) < 0
    ]  # fmt: skip
    why = (
        f" ({', '.join(learns_less)} also learn{'s' if len(learns_less) == 1 else ''} less on-task)"
        if (learns_less)
        else ""
    )
    return (
        f"Do not read a smaller absolute variance as more stable training: an arm that moves less also "
        f"varies less{why}; the matched-drift scale is the comparison at equal movement."
    )


def controls_sentence(stats: Mapping) -> str | None:
    neg = {a: c for a, c in (stats.get("controls") or {}).items() if c.get("kind") == "negative"}
    if not neg:
        return None
    bad = [a for a, c in neg.items() if c.get("passed") is False]
    if bad:
        return (
            f"The null twin {', '.join(bad)} was called larger than the reference: the instrument's "
            "false-positive check failed here, so read every 'larger' above with that in mind."
        )
    rescued = sorted(
        f"{a}'s {'off-task KL' if q == 'kl' else 'off-task dJ'}"
        for a, c in neg.items()
        for q, v in (c.get("uncorrected") or {}).items()
        if v == "supported"
    )
    if rescued:
        return (
            f"The null twin ({', '.join(neg)}) is not called larger on dJ or KL, but only after Holm's "
            f"correction over the arms sharing the reference: uncorrected, {' and '.join(rescued)} would "
            "read larger, so a single ratio of that size is what chance alone gives here."
        )
    return f"The null twin ({', '.join(neg)}) is not called larger on dJ or KL, as a null arm must not be."


def summary_sentences(stats: Mapping, gaps: Mapping[str, Mapping] | None = None) -> list[str]:
    """The sentences, in the order of the module table; a failed gate stops after the gate sentence;
    ``gaps``: arm -> ``mismatch_report.gaps_by_arm`` entry."""
    out = [s for s in (arms_sentence(stats, gaps), gate_sentence(stats)) if s]
    if not get(stats, "gate", "passed"):
        return out + [s for s in (largest_effect_sentence(stats),) if s]
    out += [s for s in (largest_effect_sentence(stats),) if s]
    out += variance_sentences(stats)
    out += [s for s in (scale_sentence(stats), caution_sentence(stats), controls_sentence(stats)) if s]
    return out


def summary_section(stats: Mapping, gaps: Mapping[str, Mapping] | None = None) -> str:
    return "\n".join(["## What this run says", "", " ".join(summary_sentences(stats, gaps)), ""])


ARM_HEADER = ["arm", "kind", "master weights", "compute", "sampler", "dropout", "deterministic", "optimizer",
              "seeds", "differs from the reference in"]  # fmt: skip


def arms_section(stats: Mapping) -> str:
    """The arm table: what every arm stores, computes and samples in (stats.json ``arms``)."""
    arms = stats.get("arms") or {}
    if not arms:
        return ""
    rows = []
    for arm, block in arms.items():
        d = block.get("description") or {}
        kind = block.get("kind", "n/a") + (f" ({d['control']} control)" if d.get("control") else "")
        cells = [d.get(k, "n/a") for k in ("masters", "compute", "sampler", "dropout", "deterministic",
                                           "optimizer", "seeds")]  # fmt: skip
        rows.append([f"**{arm}**", kind, *cells, "; ".join(block.get("effects") or []) or "-"])
    return _section(
        "Arms",
        "What each arm is (its config entry in words). Sampling (rollouts, old log-probs, evaluation, "
        "KL) runs in eval mode, so dropout acts only in the loss forward; seeds: the seed run s trains "
        "with.",
        table(ARM_HEADER, rows),
    )


def decomposition_section(stats: Mapping) -> str:
    """Main effects of the single-factor arms and each bundle taken apart (stats.json ``decomposition``)."""
    dec = stats.get("decomposition") or {}
    if dec.get("status") != "ok" or not (dec.get("main_effects") or dec.get("bundles")):
        return ""
    qs = dec.get("quantities") or {}
    alpha = dec.get("alpha", 0.05)
    head = ["contrast", "arm(s)", *qs.values()]
    rows = []
    for arm, m in (dec.get("main_effects") or {}).items():
        rows.append(
            [f"main effect: {m['effect']}", f"{arm} − {dec['reference']}", *(_effect(m.get(q)) for q in qs)]
        )
    notes = []
    for arm, b in (dec.get("bundles") or {}).items():
        for other, n in (b.get("nested") or {}).items():
            rows.append([f"{n['effect']}, given {' + '.join(n['given'])}", f"{arm} − {other}",
                         *(_effect(n.get(q)) for q in qs)])  # fmt: skip
        if b.get("status") != "ok":
            rows.append([f"bundle: {' + '.join(b.get('effects') or [])}", f"{arm} − {dec['reference']}",
                         *(_effect((b.get("whole") or {}).get(q)) for q in qs)])  # fmt: skip
            notes.append(
                f"- {arm} ({' + '.join(b.get('effects') or [])}) not taken apart: {b.get('reason')}."
            )
            continue
        parts = " + ".join(b["parts"].values())
        rows.append([f"bundle: {' + '.join(b['effects'])}", f"{arm} − {dec['reference']}",
                     *(_effect(get(b, q, "bundle")) for q in qs)])  # fmt: skip
        rows.append(["sum of the parts", parts, *(_effect(get(b, q, "sum_of_parts")) for q in qs)])
        rows.append(["interaction", f"{arm} − ({parts}) + {len(b['parts']) - 1} x {dec['reference']}",
                     *(_effect(get(b, q, "interaction")) for q in qs)])  # fmt: skip
    return _section(
        "Which factor did what (decomposition of the mean effects)",
        f"Paired contrasts over the seeds the arms share, each a mean with its {1 - alpha:.0%} t "
        "interval across seeds: a single-factor arm's difference from the reference is that factor's "
        "main effect; a bundle's difference is split into its parts' main effects and their "
        "interaction (what the factors do together beyond their sum); 'given': one factor's effect in "
        "arms that share the others. dJ: mean over the role's tasks; "
        "log off-task KL: multiplicative drift (−0.69 = half as far). Seed-variance effects of each "
        "factor: the single-factor arm's rows of the verdict table.",
        table(head, rows),
        *notes,
        *([""] if notes else []),
    )


def _section(title: str, intro: str, *body: str) -> str:
    """A report section: its heading, one paragraph, then the body lines (a table, notes)."""
    return "\n".join([f"## {title}", "", intro, "", *body[:1], "", *body[1:]])


def drift_cell(by_arm: Mapping) -> str:
    """The verdict table's 'at matched drift' cell: finding, ratio, interval; ⚠ where the scales disagree."""
    d = by_arm.get("matched_drift") or {}
    if not d:
        return "-"
    flag = " ⚠ scales disagree" if by_arm.get("scales_agree") is False else ""
    twins = "".join(f"; {t} {fmt(x.get('ratio'))}" for t, x in (d.get("twins") or {}).items())
    return f"{d.get('finding')}: {fmt(d.get('ratio'))} {ci(d.get('ratio_ci'))}{twins}{flag}"


def twin_cell(by_arm: Mapping) -> str:
    """The verdict table's 'null twin' cell: each negative control's ratio on the same comparison."""
    twins = by_arm.get("twins") or {}
    return "; ".join(f"{t} {fmt(x.get('ratio'))} {ci(x.get('ratio_ci'))}" for t, x in twins.items()) or "-"
