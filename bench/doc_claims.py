"""Every number the guides state, and where each is kept true.

The guides (README.md and docs/*.md, less the pages named in ``EXCLUDED``) state numbers; each must be
registered in docs/claims.yaml with its source, one of:

| kind      | form                                | what this script checks                     |
|-----------|-------------------------------------|---------------------------------------------|
| test      | tests/<file>.py::<test_name>        | the file exists and defines the test        |
| code      | package.module:symbol, Makefile:VAR | the symbol exists / the Makefile sets VAR   |
| config    | file.yaml:dotted.key                | the key exists (and equals `equals`)        |
| in        | a file (a bench script, a config)   | every number of the block occurs in it      |
| generated | a command                           | the block lies between generated markers    |
| log       | a heading of docs/research-log.md   | the entry holds every number of the block   |
| cite      | a public URL                        | the URL is in the claim's block             |

Generated markers: `<!-- generated: COMMAND -->` ... `<!-- end generated -->`.

A claim is `{file, context, <kind>: ...}`: `context` is a short string that occurs exactly once in `file`;
the claim covers every number of the block it lies in (a paragraph, a list item, a table row). An optional
`equals` (with `config` or `code`) compares the source's value with that number.

Not claims (the whole rule): numbers in fenced code blocks, in inline code spans, in link targets and
URLs, and in heading lines; digits glued to a letter, an underscore or an @ before them (`fp32`,
`bf16`, `H1`, `pass@1`, `k3`, `Qwen2.5`); dotted versions of three parts or more (`2.13.0`: the pins,
checked by tests/runtime/test_envs.py); ISO dates.

    python bench/doc_claims.py            # exit 1 listing unregistered numbers and stale claims
    python bench/doc_claims.py --list     # every number with its source
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from typing import NamedTuple

import yaml

REPO = Path(__file__).resolve().parents[1]
REGISTRY = REPO / "docs" / "claims.yaml"
LOG = "docs/research-log.md"
# the research log (dated history) and the pages a script writes
EXCLUDED = {LOG, "docs/example-report.md", "docs/config.md"}
KINDS = ("test", "code", "config", "in", "generated", "log", "cite")

_FENCE = re.compile(r"^\s*(```|~~~)")
_STRIP = [
    re.compile(r"`[^`]*`"),  # inline code
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"<https?://[^>]*>"),  # autolinks
    re.compile(r"https?://\S+"),  # bare URLs
    re.compile(r"\b\d{4}-\d\d-\d\d\b"),  # ISO dates
    re.compile(r"(?<![\w.])\d+(?:\.\d+){2,}(?![\w.])"),  # versions of three parts or more
]
_NUMBER = re.compile(r"(?<![A-Za-z_\d.@])(?<![A-Za-z_]-)\d+(?:[.,]\d+)*")


class Number(NamedTuple):
    file: str
    line: int  # 1-based
    text: str
    block: tuple[int, int]  # first and last line of its block, 1-based


def guide_files(repo: Path = REPO) -> list[str]:
    files = ["README.md", *sorted(f"docs/{p.name}" for p in (repo / "docs").glob("*.md"))]
    return [f for f in files if f not in EXCLUDED]


def _blocks(lines: list[str]) -> list[tuple[int, int]]:
    """Line spans (1-based, inclusive) of each paragraph, list item and table row."""
    spans, start = [], None
    for i, line in enumerate(lines, 1):
        s = line.strip()
        new_unit = s.startswith("|") or re.match(r"^([-*]|\d+\.)\s", s) or s.startswith("#")
        if not s:
            if start is not None:
                spans.append((start, i - 1))
            start = None
        elif new_unit or start is None:
            if start is not None:
                spans.append((start, i - 1))
            start = i
        if s.startswith("|") or s.startswith("#"):  # a row or a heading is a block of one line
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(lines)))
    return spans


def numbers_in(file: str, text: str) -> list[Number]:
    lines = text.splitlines()
    block_of = {}
    for span in _blocks(lines):
        for i in range(span[0], span[1] + 1):
            block_of[i] = span
    out, fenced = [], False
    for i, line in enumerate(lines, 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith("#"):
            continue
        for pattern in _STRIP:
            line = pattern.sub(lambda m: " " * len(m.group(0)), line)
        out += [Number(file, i, m.group(0), block_of[i]) for m in _NUMBER.finditer(line)]
    return out


def _lookup(data, dotted: str):
    for key in dotted.split("."):
        data = data[int(key)] if isinstance(data, list) else data[key]
    return data


def _same(value, text: str) -> bool:
    try:
        return float(value) == float(text.replace(",", ""))
    except (TypeError, ValueError):
        return False


def check_source(claim: dict, block_text: str, repo: Path = REPO) -> str | None:
    """None when the claim's source holds, else why not."""
    kinds = [k for k in KINDS if k in claim]
    if len(kinds) != 1:
        return f"needs exactly one of {', '.join(KINDS)}"
    kind, ref = kinds[0], str(claim[kinds[0]])
    if kind == "test":
        path, _, name = ref.partition("::")
        p = repo / path
        if not p.exists() or not re.search(rf"^\s*def {re.escape(name)}\(", p.read_text(), re.M):
            return f"no test {ref}"
    elif kind == "code":
        where, _, symbol = ref.partition(":")
        if where == "Makefile":
            m = re.search(rf"^{re.escape(symbol)}\s*[:?]?=\s*(\S+)", (repo / "Makefile").read_text(), re.M)
            if not m:
                return f"Makefile sets no {symbol}"
            value = m.group(1)
        else:
            try:
                value = _lookup(vars(importlib.import_module(where)), symbol)
            except (ImportError, KeyError, IndexError) as err:
                return f"no {ref} ({err!r})"
        expected = str(claim.get("equals", value))
        if not _same(value, expected) and str(value) != expected:
            return f"{ref} is {value!r}, the page says {claim['equals']}"
    elif kind == "config":
        path, _, dotted = ref.partition(":")
        try:
            value = _lookup(yaml.safe_load((repo / path).read_text()), dotted)
        except (OSError, KeyError, IndexError, TypeError) as err:
            return f"no {ref} ({err!r})"
        if "equals" in claim and not _same(value, str(claim["equals"])):
            return f"{ref} is {value!r}, the page says {claim['equals']}"
    elif kind == "in":
        source = (repo / ref).read_text() if (repo / ref).is_file() else None
        if source is None:
            return f"no file {ref}"
        absent = [n.text for n in numbers_in("", block_text) if n.text not in source]
        if absent:
            return f"{ref} does not hold {', '.join(absent)}"
    elif kind == "generated":
        text = (repo / claim["file"]).read_text()
        marker = f"<!-- generated: {ref} -->"
        start, end = text.find(marker), text.find("<!-- end generated -->")
        pos = text.find(claim["context"])
        if not (0 <= start < pos < end):
            return f"not between {marker} and <!-- end generated -->"
    elif kind == "log":
        entry = log_entry(ref, repo)
        if entry is None:
            return f"no research-log entry {ref!r}"
        logged = {n.text for n in numbers_in(LOG, entry)}
        unlogged = [n.text for n in numbers_in("", block_text) if n.text not in logged]
        if unlogged:
            return f"research-log entry {ref!r} lacks {', '.join(unlogged)}"
    elif kind == "cite" and ref not in block_text:
        return f"the block does not cite {ref}"
    return None


def log_entry(heading: str, repo: Path = REPO) -> str | None:
    """The text of the research log's entry whose heading contains ``heading`` (up to the next heading)."""
    lines = (repo / LOG).read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#") and heading in line:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("#")), len(lines))
            return "\n".join(lines[i + 1 : end])
    return None


def audit(repo: Path = REPO) -> tuple[list[tuple[Number, dict | None]], list[str]]:
    """Every number with the claim that covers it (None: unregistered), and the registry's problems."""
    claims = yaml.safe_load((repo / "docs" / "claims.yaml").read_text())["claims"]
    problems, covered = [], {}
    texts = {f: (repo / f).read_text() for f in guide_files(repo)}
    spans = {f: _blocks(t.splitlines()) for f, t in texts.items()}
    for claim in claims:
        where = f"{claim.get('file')}: {claim.get('context')!r}"
        text = texts.get(claim.get("file"))
        if text is None:
            problems.append(f"{where}: not a guide page")
            continue
        hits = [i + 1 for i, line in enumerate(text.splitlines()) if claim["context"] in line]
        if len(hits) != 1:
            problems.append(f"{where}: context found {len(hits)} times (needs exactly once, on one line)")
            continue
        span = next(s for s in spans[claim["file"]] if s[0] <= hits[0] <= s[1])
        block_text = "\n".join(text.splitlines()[span[0] - 1 : span[1]])
        why = check_source(claim, block_text, repo)
        if why:
            problems.append(f"{where}: {why}")
        covered.setdefault((claim["file"], span), claim)
    found = [(n, covered.get((n.file, n.block))) for f, t in texts.items() for n in numbers_in(f, t)]
    return found, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print every number with its source")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    found, problems = audit()
    missing = [n for n, c in found if c is None]
    if args.list:
        for n, c in found:
            source = next((f"{k}: {c[k]}" for k in KINDS if c and k in c), "UNREGISTERED")
            print(f"{n.file}:{n.line}: {n.text}  <- {source}")
    kinds = {}
    for _, c in found:
        kind = next((k for k in KINDS if c and k in c), "none")
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{len(found)} numbers; by source: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    for n in missing:
        print(f"UNREGISTERED {n.file}:{n.line}: {n.text} (block lines {n.block[0]}-{n.block[1]})")
    for p in problems:
        print(f"STALE {p}")
    return 1 if missing or problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
