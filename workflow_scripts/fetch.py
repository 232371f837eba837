"""fetch stage: copy a hub dataset or the hub base model into results/hub/ (runtime/hub_copies.py).

The workflow runs it as the LOCAL rules fetch_dataset / fetch_model (rules/fetch.smk), where the network
is; every other job is offline. No ``startup`` import: this stage loads no torch, and it must set
HF_HUB_OFFLINE before huggingface_hub or datasets is imported (``go_online_as_started``).
"""

import argparse
import logging
from pathlib import Path

from workflow_scripts.runtime import hub_copies
from workflow_scripts.runtime.smk import main_from

log = logging.getLogger("fetch")


def run(results: str | Path, datasets: list[str] = (), model: str | None = None) -> dict[str, str]:
    """Copy each dataset in ``datasets`` and the hub ``model`` under ``results``/hub; returns what went
    where (name -> copy). The CLI's entry: HF_HUB_OFFLINE stays as the caller set it."""
    written = {}
    for name in datasets:
        out = hub_copies.dataset_copy(name, results)
        log.info("%s: %d records -> %s", name, hub_copies.fetch_dataset(name, out), out)
        written[name] = str(out)
    if model:
        out = Path(hub_copies.model_copy(model, results))
        log.info("%s: %d files -> %s", model, len(hub_copies.fetch_model(model, out)), out)
        written[model] = str(out)
    return written


def from_snakemake(smk) -> None:
    """fetch_dataset: one dataset (wildcard ``dataset``) into its output; fetch_model: ``params.source``."""
    hub_copies.go_online_as_started()
    if smk.rule == "fetch_dataset":
        n = hub_copies.fetch_dataset(smk.wildcards.dataset, smk.output.dataset)
        log.info("%s: %d records -> %s", smk.wildcards.dataset, n, smk.output.dataset)
    else:
        files = hub_copies.fetch_model(smk.params.source, smk.output.model)
        log.info("%s: %d files -> %s", smk.params.source, len(files), smk.output.model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", action="append", default=[], help="a dataset name (tasks.real_datasets)")
    parser.add_argument("--model", help="a hub model id")
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run(args.results, args.dataset, args.model)
    return 0


if __name__ == "__main__":
    main_from(globals())
