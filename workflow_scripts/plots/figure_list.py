"""The list of analysis figures (name -> report category, caption file): the rule, code and report use it.

One list drives everything that names a figure: rules/analysis.smk makes one declared output per entry
(``report(..., caption=caption_file(name), category=...)``), figures.py draws one function per entry
(``figures.PLOTS``; a test checks the two match), and report.md lists each figure with ``note(name)``,
the first sentence of its caption in report/<name>.rst. Adding a figure = one entry here, one function
in figures.py, one caption file. Torch- and matplotlib-free: the Snakefile imports it when parsing.
"""

import os
import re
from collections.abc import Mapping
from pathlib import Path

FIGURES: dict[str, str] = {
    "dJ_by_task": "Performance",
    "variance_components": "Variance tests",
    "variance_ratios": "Variance tests",
    "kl_by_task": "KL to base",
    "sparsity_by_module": "Update sparsity",
    "sparsity_vs_eta": "Update sparsity",
    "overlap": "Update sparsity",
    "training_curves": "Training",
    "mismatch": "Training",
    "heldout_curves": "Learning curves",
    "heldout_variance": "Learning curves",
}
REPORT_DIR = Path(__file__).resolve().parents[2] / "report"


def caption_file(name: str) -> str:
    """The caption of a figure, relative to rules/ (Snakemake resolves report captions from the .smk)."""
    return f"../report/{name}.rst"


def note(name: str, report_dir: Path = REPORT_DIR) -> str:
    """The first sentence of the figure's caption, without rst markup (the report's figure list)."""
    try:
        text = (report_dir / f"{name}.rst").read_text(encoding="utf-8")
    except OSError:
        return ""
    text = re.sub(r"``([^`]*)``", r"\1", " ".join(text.split()))
    return re.split(r"(?<=[.:])\s", text, maxsplit=1)[0].rstrip(".:")


def figures_section(figures: Mapping[str, str | os.PathLike], report_path: str | os.PathLike) -> str:
    """report.md's "Figures": each figure linked relative to the report, with its ``note``."""
    if not figures:
        return ""
    here = Path(report_path).resolve().parent
    out = ["## Figures", ""]
    for name, path in figures.items():
        rel = os.path.relpath(Path(path).resolve(), here)
        out.append(f"- [{name}]({rel}): {note(name)}".rstrip(": "))
    return "\n".join([*out, ""])
