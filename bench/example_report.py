"""Copy a finished run's report into docs/example-report.md: the README's example of the default's numbers.

The README describes report.md's sections; the numbers a reader sees there come from this copy of a real
run's ``results/analysis/report.md``, never typed by hand. The copy gets one header line naming where it
came from: the commit (``--commit``, else ``git rev-parse`` of the run folder when it is a checkout), the
machine (``--machine``, else the CPU or GPU recorded in the base model's ``numerics``,
``results/models/base.json``) and the day the report was written. Figure links, relative to the run's
analysis folder, become plain paths (the figures stay in the run); the glossary link points to docs/ again.

    .venv/bin/python bench/example_report.py /path/to/finished/run --commit 0346d71 \\
        --machine "AMD EPYC Zen 3 (AVX2, no native bf16), 2 cores"
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "example-report.md"
FIGURE_LINK = re.compile(r"\[([^\]]+)\]\((figures/[^)\s]+)\)")
GLOSSARY = "docs/glossary.md"  # the report links it relative to the run; the copy lives beside it
GLOSSARY_LINK = re.compile(r"\]\([^)\s]*" + re.escape(GLOSSARY) + r"\)")


def run_commit(run_dir: Path) -> str | None:
    """The short commit of the run folder when it is a git checkout, else None."""
    cmd = ["git", "-C", str(run_dir), "rev-parse", "--short", "HEAD"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def run_machine(run_dir: Path) -> str | None:
    """The numerics path recorded with the base model: CPU (or GPU) and torch version, else None."""
    path = run_dir / "results" / "models" / "base.json"
    if not path.exists():
        return None
    numerics = json.loads(path.read_text()).get("numerics") or {}
    if numerics.get("cuda_device"):
        device = str(numerics["cuda_device"])
    else:
        bf16 = "native bf16" if numerics.get("cpu_bf16") else "no native bf16"
        device = f"{numerics.get('cpu_model', 'unknown CPU')} ({numerics.get('cpu_capability', '?')}, {bf16})"
    return f"{device}, torch {numerics.get('torch', '?')}"


def example(run_dir: Path, commit: str | None = None, machine: str | None = None) -> str:
    """The text of docs/example-report.md for the finished run in ``run_dir``."""
    report = run_dir / "results" / "analysis" / "report.md"
    if not report.exists():
        raise SystemExit(f"{report}: no report (is the run finished?)")
    commit = commit or run_commit(run_dir)
    source = f"commit {commit}" if commit else "commit not recorded"
    machine = machine or run_machine(run_dir) or "machine not recorded"
    day = dt.datetime.fromtimestamp(report.stat().st_mtime, tz=dt.UTC).date().isoformat()
    body = FIGURE_LINK.sub(lambda m: f"{m.group(1)} (`results/analysis/{m.group(2)}` in the run)",
                           report.read_text())  # fmt: skip
    body = GLOSSARY_LINK.sub("](glossary.md)", body)
    header = (
        "> Example: `results/analysis/report.md` of a real run of the default experiment (`make run`), "
        f"{source}, {machine}, written {day}; copied by `bench/example_report.py`, not edited."
    )
    return f"{header}\n\n{body}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the run's folder (holds results/analysis/report.md)")
    parser.add_argument("--commit", help="the commit the run's code came from (default: git of run_dir)")
    parser.add_argument("--machine", help="the machine it ran on (default: base.json's numerics)")
    parser.add_argument("--out", type=Path, default=OUT, help="default: docs/example-report.md")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(example(args.run_dir, args.commit, args.machine))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
