""" "What this run says": the report's first section, 5-8 short bullets generated from stats.json.

Bullets, in order, each present only where stats.json has its numbers (``summary_sentences``):

1. what this run can detect (the whole rule's MDE at these seeds, Holm over the primary family) and the
   overlay that answers the variance questions (``analysis.decisive``);
2. whether training worked (the gate), then each factor's mean dJ effect on-task / off-task with its
   interval, by the factor's short name (``short_name``: stall, dropout, SR noise, ...);
3. which factor carries the most, only as the tested difference of two parts' |effects|
   (``decompose.part_differences``; "no factor is shown to carry more" where its interval reaches 0);
4. each bundle's interaction with its interval on every quantity (no words about adding up);
5-6. each arm's H2 / H3 finding and ratio beside the null yardstick (``yardstick``), an inconclusive
   "not after Holm" with its adjusted p;
7. what a smaller variance means given the movement-matched comparison (stats.json ``matched``), or that
   it is not available;
8. seeds per arm needed for a ratio of r0 (2x).

The report also takes its arm table (``arms_section``, with each arm in factors and where its
sampler-trainer gap comes from) and decomposition table (``decomposition_section``) from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflow_scripts.statistics.mismatch_report import gap_words
from workflow_scripts.statistics.report_tables import ci, fmt, get, table
from workflow_scripts.statistics.yardstick import words as yardstick_words

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


SHORT = (  # a factor's short name in the summary, from its effect name (arms.effect_name)
    ("rounding stall", "stall"),
    ("precision noise", "SR noise"),
    ("dropout", "dropout"),
    ("sampler-trainer mismatch", "mismatch"),
    ("IS correction", "IS correction"),
    ("update noise", "update noise"),
)


def short_name(effect: str) -> str:
    """The summary's short name of a factor ("stall", "dropout", "SR noise"); else its effect name."""
    return next((short for prefix, short in SHORT if effect.startswith(prefix)), effect)


def _arm_short(stats: Mapping, arm: str) -> str:
    effects = get(stats, "arms", arm, "effects") or []
    return " + ".join(short_name(e) for e in effects) or arm


def stats_alpha(stats: Mapping) -> float:
    return float(get(stats, "config", "alpha") or 0.05)


def _powers(stats: Mapping) -> list[Mapping]:
    out = []
    for q in ("dJ", "kl"):
        for comp in (get(stats, "mixed_model", "off_task", q, "comparisons") or {}).values():
            p = comp.get("power") or {}
            if p.get("status") == "ok":
                out.append(p)
    return out


def _span(values: list[Any]) -> str:
    vals = sorted({float(v) for v in values if v is not None})
    if not vals:
        return "n/a"
    return fmt(vals[0]) if len(vals) == 1 else f"{fmt(vals[0])}-{fmt(vals[-1])}"


def detect_bullet(stats: Mapping) -> str:
    """What this run can detect (its MDE at these seeds) and the overlay that answers the variance
    questions (analysis.decisive)."""
    seeds = get(stats, "n", "seeds") or {}
    ref = stats.get("reference")
    others = sorted({v for a, v in seeds.items() if a != ref})
    powers = _powers(stats)
    mdes = [p.get("mde_ratio") for p in powers]
    mde = f"{_span(mdes)}x" if any(m is not None for m in mdes) else "above the largest ratio simulated"
    if not powers:
        mde = "not computed (no power simulation)"
    if None in mdes and any(m is not None for m in mdes):
        mde += " (not reached for some)"
    fam = get(stats, "primary", "family_size")
    dec = get(stats, "config", "decisive") or {}
    text = (
        f"What this run can detect: at {_span(others)} seeds per arm against {seeds.get(ref, 'n/a')} of "
        f"{ref}, the smallest off-task seed-variance ratio found with {_target(powers)} power is {mde}"
        + (f" (Holm over the {fam} variance claims of the primary family)" if fam else "")
    )
    if dec:
        text += (
            f"; the variance questions are answered by `{dec.get('config')}` ({dec.get('seeds')} seeds per "
            f"arm, measured MDE {fmt(dec.get('mde_ratio'))}x)"
        )
    return text + "."


def _target(powers: list[Mapping]) -> str:
    return f"{powers[0]['target']:.0%}" if powers else "the target"


def means_bullet(stats: Mapping) -> str | None:
    """The gate, then the mean effect of each factor (single-factor arms) and bundle, on- and off-task."""
    g = stats.get("gate") or {}
    if g.get("passed"):
        head = (f"Training worked ({g.get('arm')} on-task dJ {_signed(g.get('mean'))} ± {fmt(g.get('se'), 2)}"
                f" SE, {g.get('n_seeds')} seeds)")  # fmt: skip
    else:
        head = (
            f"Training did not improve the on-task score ({g.get('reason') or 'no reference arm'}): every "
            "verdict is 'not testable' and the numbers only describe the runs"
        )
    dec = stats.get("decomposition") or {}
    items = []
    if dec.get("status") == "ok":
        for arm, m in (dec.get("main_effects") or {}).items():
            items.append(f"{short_name(m['effect'])} ({arm}) {_roles(m)}")
        for arm, b in (dec.get("bundles") or {}).items():
            whole = {q: get(b, q, "bundle") for q in ("on_task_dJ", "off_task_dJ")}
            if b.get("status") != "ok":
                whole = b.get("whole") or {}
            items.append(f"{_arm_short(stats, arm)} ({arm}) {_roles(whole)}")
    if not items:
        return head + "."
    return (
        f"{head}. Mean dJ effects against {dec.get('reference')}, on-task / off-task [95% CI]: "
        + "; ".join(items)
        + "."
    )


def _roles(block: Mapping) -> str:
    return f"{_effect(block.get('on_task_dJ'))} / {_effect(block.get('off_task_dJ'))}"


QUANTITY_LABEL = {"on_task_dJ": "on-task", "off_task_dJ": "off-task", "off_task_log_kl": "log KL"}


def carries_bullet(stats: Mapping) -> str | None:
    """Per bundle: which factor carries the most, only where the difference of the two is tested."""
    dec = stats.get("decomposition") or {}
    clauses = []
    for arm, b in (dec.get("bundles") or {}).items():
        if b.get("status") != "ok":
            continue
        for q in ("on_task_dJ", "off_task_dJ"):
            block = b.get(q) or {}
            diffs = block.get("part_differences") or {}
            if not diffs:
                continue
            cm = block.get("carries_most") or {}
            (d,) = list(diffs.values())[:1]
            first, second = (short_name(_main_effect(dec, d[k])) for k in ("first", "second"))
            label = f"|{first}| − |{second}|"
            numbers = f"{label} {_effect(d)}"
            if cm.get("supported"):
                top = short_name(_main_effect(dec, cm["arm"]))
                clauses.append(f"{arm} {QUANTITY_LABEL[q]}: {top} carries the most ({numbers})")
            else:
                clauses.append(f"{arm} {QUANTITY_LABEL[q]}: no factor is shown to carry more ({numbers})")
    return (
        (
            "Which factor carries the most, tested as the difference of their effects: "
            + "; ".join(clauses)
            + "."
        )
        if clauses
        else None
    )


def _main_effect(dec: Mapping, arm: str) -> str:
    return get(dec, "main_effects", arm, "effect") or arm


def interaction_bullet(stats: Mapping) -> str | None:
    """Per bundle: its interaction with the interval, on every role (no words about adding up)."""
    dec = stats.get("decomposition") or {}
    out = []
    for arm, b in (dec.get("bundles") or {}).items():
        if b.get("status") != "ok":
            continue
        parts = " − ".join(short_name(_main_effect(dec, a)) for a in (b.get("parts") or {}).values())
        roles = [
            f"{QUANTITY_LABEL.get(q, q)} {_effect(get(b, q, 'interaction'))}"
            for q in (dec.get("quantities") or {})
        ]
        out.append(f"{arm} − {parts}: " + ", ".join(roles))
    return ("Interaction [95% CI]: " + "; ".join(out) + ".") if out else None


def _ratio(stats: Mapping, h: str, arm: str) -> str:
    q = "dJ" if h == "H2" else "kl"
    comp = get(stats, "mixed_model", "off_task", q, "comparisons", arm) or {}
    return f"{fmt(comp.get('ratio'))}x {ci(comp.get('ratio_ci'))}" if comp.get("status") == "ok" else "n/a"


def _finding(v: Mapping) -> str:
    finding = str(v.get("finding"))
    if finding == "inconclusive" and "not after Holm" in str(v.get("reason")) and v.get("holm_p") is not None:
        return f"inconclusive (not after Holm, adjusted p {fmt(v['holm_p'], 2)})"
    return finding


def variance_bullets(stats: Mapping) -> list[str]:
    """One bullet per hypothesis (H2, H3): each arm's finding and ratio beside the null yardstick."""
    out = []
    fam = get(stats, "primary", "family_size")
    for h in ("H2", "H3"):
        by_arm = get(stats, "verdicts", h, "by_arm") or {}
        if not by_arm or all(v.get("verdict") == "not testable" for v in by_arm.values()):
            continue
        items = [
            f"{a} {_finding(v)}, {_ratio(stats, h, a)} ({yardstick_words(v.get('yardstick'))})"
            for a, v in by_arm.items()
        ]
        twins = next((v.get("twins") for v in by_arm.values() if v.get("twins")), None) or {}
        twin = "; ".join(
            f"null twin {t} {fmt(x.get('ratio'))}x {ci(x.get('ratio_ci'))}" for t, x in twins.items()
        )
        corr = f", Holm over {fam}" if fam else ""
        out.append(
            f"Seed variance of {QUANTITY_WORDS[h]} against {stats.get('reference')} "
            f"({h}, absolute scale{corr}): " + "; ".join(items) + (f"; {twin}" if twin else "") + "."
        )
    return out


def _matched_word(absolute: str | None, at_match: Mapping) -> str:
    """What an absolute finding becomes at equal movement (one quantity of ``matched.arms[arm]``)."""
    if at_match.get("status") != "ok":
        return f"not compared ({at_match.get('reason') or 'no fit'})"
    found = at_match.get("finding", "n/a")
    yard = yardstick_words(at_match.get("yardstick"))
    said = f"{found}, {fmt(at_match.get('ratio'))}x {ci(at_match.get('ratio_ci'))} ({yard})"
    if absolute != "smaller":
        return said
    return f"still {said}" if found == "smaller" else f"{said}: not shown smaller once movement is matched"


def matched_bullet(stats: Mapping) -> str | None:
    """What a smaller variance means given the movement-matched comparison (stats.json ``matched``, as
    ``statistics.matched.matched`` writes it: ``arms[arm]`` = {match{status, step, kl_ratio}, dJ, kl});
    only for arms whose H2 or H3 finding is "smaller"."""
    findings = {
        (h, a): v.get("finding")
        for h in ("H2", "H3")
        for a, v in (get(stats, "verdicts", h, "by_arm") or {}).items()
    }
    smaller = sorted({a for (_, a), f in findings.items() if f == "smaller"})
    if not smaller:
        return None
    who = ", ".join(smaller)
    matched = stats.get("matched") or {}
    if matched.get("status") != "ok":
        return (
            f"A smaller variance ({who}) is not yet more stable training: an arm that moves less also varies "
            "less, and the movement-matched comparison is not available in this run."
        )
    items = []
    for a in smaller:
        block = (matched.get("arms") or {}).get(a) or {}
        match = block.get("match") or {}
        if match.get("status") != "ok":
            items.append(f"{a} not compared ({match.get('reason') or 'no match'})")
            continue
        step = "its final step" if match.get("step") == "final" else f"step {match.get('step')}"
        qs = [
            f"off-task {word} {_matched_word(findings.get((h, a)), block.get(q) or {})}"
            for h, q, word in (("H2", "dJ", "dJ"), ("H3", "kl", "KL"))
        ]
        items.append(f"{a} (reference at {step}, KL ratio {fmt(match.get('kl_ratio'))}): " + "; ".join(qs))
    return (
        "At equal movement (the reference's own checkpoints where its off-task KL matches the arm's; "
        "Holm over that block): " + "; ".join(items) + "."
    )


def seeds_bullet(stats: Mapping) -> str | None:
    """Seeds per arm the whole rule needs to find a 2x (r0) ratio at the target power."""
    parts = []
    for q, word in (("dJ", "off-task dJ"), ("kl", "off-task KL")):
        ps = [
            (comp.get("power") or {})
            for comp in (get(stats, "mixed_model", "off_task", q, "comparisons") or {}).values()
            if (comp.get("power") or {}).get("status") == "ok"
        ]
        if not ps:
            continue
        need = [p.get("seeds_needed_r0") for p in ps]
        cap = max(p["max_seeds"] for p in ps)
        text = _span(need) if any(n is not None for n in need) else f"> {cap}"
        if None in need and any(n is not None for n in need):
            text += f" (> {cap} for some arms)"
        parts.append(f"{word} {text}")
    if not parts:
        return None
    r0 = fmt(get(stats, "config", "variance_ratio_margin") or 2.0)
    return (
        f"Seeds per arm needed to find a {r0}x ratio with {_target(_powers(stats))} power: "
        + "; ".join(parts)
        + "."
    )


def summary_sentences(stats: Mapping, gaps: Mapping[str, Mapping] | None = None) -> list[str]:
    """The bullets, in order: detect, means (with the gate), carries the most, interaction, H2, H3,
    movement matched, seeds for 2x; a failed gate stops after the means. ``gaps`` is kept for the
    report's call (the arms' gaps are in ``arms_section``)."""
    del gaps
    out = [detect_bullet(stats)] + [s for s in (means_bullet(stats),) if s]
    if not get(stats, "gate", "passed"):
        return out
    out += [s for s in (carries_bullet(stats), interaction_bullet(stats)) if s]
    out += variance_bullets(stats)
    out += [s for s in (matched_bullet(stats), seeds_bullet(stats)) if s]
    return out[:8]


def summary_section(stats: Mapping, gaps: Mapping[str, Mapping] | None = None) -> str:
    return "\n".join(["## What this run says", "", *(f"- {b}" for b in summary_sentences(stats, gaps)), ""])


ARM_HEADER = ["arm", "kind", "master weights", "compute", "sampler", "dropout", "deterministic", "optimizer",
              "seeds", "differs from the reference in"]  # fmt: skip


def arms_section(stats: Mapping, gaps: Mapping[str, Mapping] | None = None) -> str:
    """The arm table: what every arm stores, computes and samples in (stats.json ``arms``), then each arm
    in factors with where its sampler-trainer gap comes from (``arms_sentence``)."""
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
        *([arms_sentence(stats, gaps) or "", ""] if arms_sentence(stats, gaps) else []),
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


def twin_cell(by_arm: Mapping) -> str:
    """The verdict table's 'null twin' cell: each negative control's ratio on the same comparison."""
    twins = by_arm.get("twins") or {}
    return "; ".join(f"{t} {fmt(x.get('ratio'))} {ci(x.get('ratio_ci'))}" for t, x in twins.items()) or "-"
