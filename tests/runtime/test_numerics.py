"""Numerics provenance: the record names the path this process computes on; the report groups by path."""

import copy

import torch

from workflow_scripts.runtime.numerics import numerics_provenance, path_label, provenance_section


def test_the_record_names_the_kernels_builds_and_threads_of_this_process():
    record = numerics_provenance()
    assert record["torch"] == torch.__version__ and record["cuda"] == torch.version.cuda
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["threads"]["intra_op"] == torch.get_num_threads()
    assert record["onednn"] and record["onednn"] in torch.__config__.show()
    assert record["cuda_device"] is None or record["cuda_device"]["name"]
    assert record["cpu_capability"] in path_label(record) and record["torch"] in path_label(record)


def test_the_report_lists_each_path_once_and_warns_when_records_span_several():
    here = numerics_provenance()
    # a CPU path other than this machine's, whichever this machine has (an AVX2 CPU is common)
    other = ("AVX512", True) if here["cpu_capability"] == "AVX2" else ("AVX2", False)
    elsewhere = {**copy.deepcopy(here), "cpu_capability": other[0], "cpu_bf16": other[1]}
    label = f"[{other[0]}, {'native bf16' if other[1] else 'no native bf16'}]"
    one = provenance_section({"base": here, "fp32-s1": here})
    assert one.count(path_label(here)) == 1 and "2: base, fp32-s1" in one and "numerics paths**" not in one
    two = provenance_section({"base": here, "fp32-s1": elsewhere, "bf16-s1": None})
    assert "**3 numerics paths**" in two and label in two and "not recorded" in two
    assert provenance_section({}) == ""
