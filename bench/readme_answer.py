"""The README's answer: three sentences with numbers, read from a real run's report (docs/example-report.md).

README.md holds this script's output between `<!-- generated: python bench/readme_answer.py -->` and
`<!-- end generated -->`; tests/bench/test_readme_answer.py fails when the two differ. After
`bench/example_report.py` refreshes docs/example-report.md, `python bench/readme_answer.py --write`
refreshes the README's block.

The report's bullets are prose whose wording changes; this script reads the parts the report writes in a
fixed shape instead (``workflow_scripts/report.py`` and ``workflow_scripts/statistics/summary.py``):

- the reference's gain: "<arm>('s) on-task dJ (is) <mean> ± <se> (SE, <n> seeds" (summary or gate);
- each factor's mean effect: the decomposition table's `main effect: ...` and `bundle: ...` rows, by header;
- each arm's H2 / H3 ratio: the verdict table's `comparison`, `finding (verdict)`, `ratio [95% CI]` and
  `null twin` columns;
- what the run can detect: the summary's "found with <p>% power is <mde>x" and its decisive overlay, else
  the verdict table's `MDE <r>x` cells;
- seeds per arm: the header's "Seeds per arm (after exclusions): <arm> <n>, ...".

    python bench/readme_answer.py                 # print the answer
    python bench/readme_answer.py --write         # put it between README.md's generated markers
    python bench/readme_answer.py --report FILE   # read another report.md
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workflow_scripts.statistics.summary import short_name  # noqa: E402  (the summary's factor names)

REPORT = REPO / "docs" / "example-report.md"
README = REPO / "README.md"
COMMAND = "python bench/readme_answer.py"
START, END = f"<!-- generated: {COMMAND} -->", "<!-- end generated -->"

NUM = r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
CI = rf"{NUM} \[{NUM}, {NUM}\]"
GATE = re.compile(
    rf"(?P<arm>[\w.-]+?)(?:'s)? on-task dJ (?:is )?(?P<mean>{NUM}) ± (?P<se>{NUM}) \(?SE, (?P<n>\d+) seeds"
)
DETECT = re.compile(r"found with (?P<target>\d+%) power is (?P<mde>[\d.]+(?:-[\d.]+)?)x")
DECISIVE = re.compile(
    r"answered by `(?P<config>[^`]+)` \((?P<seeds>\d+) seeds per arm, measured MDE (?P<mde>[\d.]+)x\)"
)
SEEDS = re.compile(r"Seeds per arm \(after exclusions\): (?P<list>[^.]+)\.")
MDE = re.compile(r"MDE (?P<mde>[\d.]+)x")
TARGET = re.compile(r"at (?P<target>\d+%)")
CAVEAT = (
    "conditional on the shipped base model (`data/base`) at miniature scale (a tiny Llama trained on "
    "synthetic arithmetic, on CPU): a measurement of this setup, not of an LLM at paper scale"
)


class ReportError(ValueError):
    """The report lacks a part the answer needs."""


def sections(text: str) -> dict[str, str]:
    """Each `## ` section's body by its title (the text before the first is under "")."""
    out, title, lines = {}, "", []
    for line in text.splitlines():
        if line.startswith("## "):
            out[title] = "\n".join(lines)
            title, lines = line[3:].strip(), []
        else:
            lines.append(line)
    out[title] = "\n".join(lines)
    return out


def section(text: str, prefix: str) -> str:
    return next((body for title, body in sections(text).items() if title.startswith(prefix)), "")


def table(body: str) -> list[dict[str, str]]:
    """The first markdown table of ``body``: one dict per row, keyed by the header's cells."""
    rows = [ln.strip() for ln in body.splitlines() if ln.strip().startswith("|")]
    if len(rows) < 2:
        return []
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    header = cells[0]
    return [dict(zip(header, c, strict=False)) for c in cells[2:]]


def gate(text: str) -> dict[str, str]:
    m = GATE.search(section(text, "What this run says")) or GATE.search(text)
    if not m:
        raise ReportError('no reference gain ("<arm> on-task dJ <mean> ± <se> (SE, <n> seeds")')
    return m.groupdict()


def effects(text: str) -> tuple[list[dict], list[dict]]:
    """(main effects, bundles) of the decomposition table: {name, arm, on, off}."""
    rows = table(section(text, "Which factor did what"))
    mains, bundles = [], []
    for row in rows:
        kind, _, name = row.get("contrast", "").partition(": ")
        item = {
            "name": name,
            "arm": row.get("arm(s)", "").split(" − ")[0].strip(),
            "on": row.get("on-task dJ", "n/a"),
            "off": row.get("off-task dJ", "n/a"),
        }
        if kind == "main effect":
            mains.append(item)
        elif kind == "bundle":
            bundles.append(item)
    if not mains and not bundles:
        raise ReportError("no decomposition table (rows 'main effect: ...', 'bundle: ...')")
    return mains, bundles


def variances(text: str) -> dict[str, dict[str, dict[str, str]]]:
    """{H2|H3: {arm: {finding, ratio, twin, mde, target}}} from the verdict table."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for row in table(section(text, "Verdicts")):
        h = row.get("", "")
        if h not in ("H2", "H3"):
            continue
        arm = row.get("comparison", "").split(" vs ")[0].strip()
        finding = re.search(r"\*\*(.+?)\*\*", row.get("finding (verdict)", ""))
        mde, target = MDE.search(row.get("power / MDE", "")), TARGET.search(row.get("power / MDE", ""))
        twin = re.match(rf"(?P<name>[\w.-]+) (?P<ratio>{CI})", row.get("null twin", ""))
        out.setdefault(h, {})[arm] = {
            "finding": finding.group(1) if finding else "n/a",
            "ratio": row.get("ratio [95% CI]", "n/a"),
            "twin": f"{twin['name']} {twin['ratio']}" if twin else "",
            "mde": mde["mde"] if mde else "",
            "target": target["target"] if target else "",
        }
    if not out:
        raise ReportError("no H2/H3 rows in the verdict table")
    return out


def seeds(text: str) -> dict[str, str]:
    m = SEEDS.search(text)
    pairs = [p.strip().rsplit(" ", 1) for p in m["list"].split(",")] if m else []
    return {p[0]: p[1] for p in pairs if len(p) == 2}


def _span(values: list[str]) -> str:
    nums = sorted({float(v) for v in values if v})
    if not nums:
        return "n/a"
    show = [f"{x:g}" for x in (nums[0], nums[-1])]
    return show[0] if show[0] == show[1] else f"{show[0]}-{show[1]}"


def _point(cell: str) -> str:
    """A table cell "<mean> [<lo>, <hi>]" as its mean, marked where the interval holds 0."""
    m = re.match(rf"(?P<mean>{NUM}) \[(?P<lo>{NUM}), (?P<hi>{NUM})\]", cell or "")
    if not m:
        return cell or "n/a"
    holds_zero = float(m["lo"]) <= 0 <= float(m["hi"])
    return m["mean"] + (" (interval holds 0)" if holds_zero else "")


def means_sentence(g: dict, mains: list[dict], bundles: list[dict]) -> str:
    items = [f"{short_name(m['name'])} ({m['arm']}) {_point(m['on'])} / {_point(m['off'])}" for m in mains]
    items += [
        f"{' + '.join(short_name(p) for p in b['name'].split(' + '))} ({b['arm']}, the source experiment's "
        f"bf16 arm) {_point(b['on'])} / {_point(b['off'])}"
        for b in bundles
    ]
    return (
        f"Training works ({g['arm']}'s on-task dJ {g['mean']} ± {g['se']} SE, {g['n']} seeds); against "
        f"{g['arm']}, the mean dJ on-task / off-task is " + "; ".join(items) + "."
    )


def variance_sentence(ref: str, var: dict) -> str:
    h2, h3 = var.get("H2", {}), var.get("H3", {})
    arms = list(dict.fromkeys([*h2, *h3]))
    larger = [
        f"{a} on {h}" for h in ("H2", "H3") for a, v in var.get(h, {}).items() if v["finding"] == "larger"
    ]
    lead = (
        f"Seed variance found larger than {ref}'s: {', '.join(larger)}"
        if larger
        else f"No arm's seed variance (the spread across training seeds) of off-task dJ or KL is found "
        f"larger than {ref}'s"
    )

    def cell(v: dict | None) -> str:
        return f"{v['finding']} ({v['ratio'].split(' ')[0]}x)" if v else "n/a"

    items = [f"{a} {cell(h2.get(a))} / {cell(h3.get(a))}" for a in arms]
    twin = next((v["twin"] for v in h2.values() if v["twin"]), "")
    tail = f"; a null twin, {ref} again with other seeds, gets {twin.partition(' ')[2]}" if twin else ""
    return f"{lead} (dJ / KL, ratio arm / {ref}): " + "; ".join(items) + tail + "."


def detect_sentence(text: str, ref: str, var: dict) -> str:
    summary = section(text, "What this run says")
    det, dec = DETECT.search(summary), DECISIVE.search(summary)
    rows = [v for h in ("H2", "H3") for v in var.get(h, {}).values()]
    mde = det["mde"] if det else _span([v["mde"] for v in rows])
    target = det["target"] if det else next((v["target"] for v in rows if v["target"]), "the target")
    n = seeds(text)
    others = _span([s for a, s in n.items() if a != ref])
    head = f"With {others} seeds per arm against {n.get(ref, 'n/a')} of {ref}" if n else "At these seeds"
    overlay = (
        f" (`{dec['config']}`, {dec['seeds']} seeds per arm, measured MDE {dec['mde']}x, answers the "
        "variance questions)"
        if dec
        else ""
    )
    return (
        f"{head}, this run detects only seed-variance ratios of {mde}x or more at {target} power{overlay}; "
        f"all of it is {CAVEAT}."
    )


def answer(text: str) -> str:
    """The three sentences, one paragraph, one sentence a line."""
    g = gate(text)
    mains, bundles = effects(text)
    var = variances(text)
    return "\n".join(
        [
            means_sentence(g, mains, bundles),
            variance_sentence(g["arm"], var),
            detect_sentence(text, g["arm"], var),
        ]
    )


def block(readme: str) -> str | None:
    """The README's generated block (between the markers, stripped), or None."""
    start, end = readme.find(START), readme.find(END)
    return readme[start + len(START) : end].strip() if 0 <= start < end else None


def write(readme: Path, text: str) -> None:
    old = readme.read_text()
    start, end = old.find(START), old.find(END)
    if not 0 <= start < end:
        raise ReportError(f"{readme}: no {START} ... {END}")
    readme.write_text(old[: start + len(START)] + "\n" + text + "\n" + old[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, default=REPORT, help="a report.md (default: %(default)s)")
    parser.add_argument("--write", action="store_true", help="put the answer into README.md's block")
    args = parser.parse_args(argv)
    text = answer(args.report.read_text())
    if args.write:
        write(README, text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
