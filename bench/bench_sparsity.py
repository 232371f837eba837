"""Benchmark the streaming sparsity diff against the I/O floor and its memory target.

Generates a base/final checkpoint pair of ``--size-gb`` per side (float32, or ``--dtype bfloat16``;
one large tensor, layer-shaped ones and norms; the final is sharded with an index json, so that path
is exercised) in a temp dir, then measures, each in a fresh subprocess so the generator's memory does
not count:

- floor: read every tensor of both checkpoints through ``safe_open`` tensor by tensor, copying it into
  a reused, pre-faulted buffer (safe_open hands out zero-copy mmap views, so a copy is the cheapest
  way to actually read every byte);
- diff: ``sparsity.diff_checkpoints`` on the pair (the full per-tensor computation).

Warm runs (page cache holding the files, as right after generation) are the headline; "cold" runs
first evict the files from the page cache with posix_fadvise(DONTNEED) and are printed for context.
Each measurement is the minimum over ``--repeats`` alternating runs (shared machines are noisy).

Targets: throughput_ratio = floor_time / diff_time >= 0.5; peak_rss_ratio = peak RSS of the diff
process / (3 x largest tensor + 300 MB) <= 1. The temp dir is always removed.

Usage: .venv/bin/python bench/bench_sparsity.py [--size-gb 1] [--dtype float32] [--threads 1] [--repeats 3]
                                               [--no-cold]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20


def _shapes(size_gb: float, itemsize: int = 4) -> dict[str, tuple[int, ...]]:
    """Llama-like tensors totalling ~size_gb: a large embedding (~25%) plus layers and norms."""
    total = int(size_gb * (1 << 30)) // itemsize
    hidden = 2048
    vocab = max(1024, total // 4 // hidden)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    per_layer = 4 * hidden * hidden + 3 * hidden * (2 * hidden) + 2 * hidden
    n_layers = max(1, -(-(total - vocab * hidden) // per_layer))  # round up: at least size_gb
    for i in range(n_layers):
        p = f"model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{proj}.weight"] = (hidden, hidden)
        shapes[p + "mlp.gate_proj.weight"] = (2 * hidden, hidden)
        shapes[p + "mlp.up_proj.weight"] = (2 * hidden, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, 2 * hidden)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def generate(root: Path, size_gb: float, dtype: str = "float32") -> tuple[Path, Path, int]:
    """Write base (one file) and final (two shards + index); return the dirs and the largest tensor bytes."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    base_dir, final_dir = root / "base", root / "final"
    base_dir.mkdir()
    final_dir.mkdir()
    base, finals = {}, [{}, {}]
    torch_dtype = getattr(torch, dtype)
    for i, (name, shape) in enumerate(_shapes(size_gb, torch_dtype.itemsize).items()):
        if name.endswith("norm.weight"):
            w = torch.ones(shape)
            new = w.clone()  # norms untouched, as in bf16 runs
        else:
            w = torch.randn(shape, generator=gen) * 0.02
            update = torch.randn(shape, generator=gen) * 2e-6  # ~1e-4 relative: mixed counts per eta
            update[: shape[0] // 3] = 0  # a third of the rows untouched
            new = w + update
        base[name] = w.to(torch_dtype)
        finals[i % 2][name] = new.to(torch_dtype)
    save_file(base, base_dir / "model.safetensors")
    weight_map = {}
    for k, shard in enumerate(finals, 1):
        fname = f"model-{k:05d}-of-00002.safetensors"
        save_file(shard, final_dir / fname)
        weight_map.update(dict.fromkeys(shard, fname))
    with open(final_dir / "model.safetensors.index.json", "w", encoding="utf-8") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    largest = max(t.numel() * t.element_size() for t in base.values())
    for path in _files(root):
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return base_dir, final_dir, largest


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.safetensors"))


def evict(root: Path) -> None:
    """Drop only these files from the page cache (clean pages; no root needed)."""
    for path in _files(root):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def _child_floor(root: Path) -> dict:
    import torch
    from safetensors import safe_open

    torch.set_num_threads(1)  # as the diff: OpenMP sync per copy would inflate the floor on busy machines
    files = _files(root)
    largest = 0
    for path in files:
        with safe_open(path, framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a dict)
                sl = fh.get_slice(name)
                largest = max(largest, math.prod(sl.get_shape()))
    buf = torch.zeros(largest, dtype=torch.float64)  # pre-faulted, reused: only the reading is timed
    start = time.perf_counter()
    for path in files:
        with safe_open(path, framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a dict)
                t = fh.get_tensor(name).reshape(-1)
                buf.view(t.dtype)[: t.numel()].copy_(t)
                del t
    return {"seconds": time.perf_counter() - start}


def peak_rss() -> int:
    """Peak RSS of this process image (VmHWM): unlike ru_maxrss it does not inherit the parent's peak."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux: best effort


def _child_diff(base: Path, final: Path, threads: int) -> dict:
    sys.path.insert(0, str(REPO))
    from workflow_scripts.sparsity import diff_checkpoints

    baseline = peak_rss()
    start = time.perf_counter()
    frame = diff_checkpoints(base, final, threads=threads)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "peak_rss": peak_rss(),
        "rss_after_imports": baseline,
        "numel": int(frame["numel"].sum()),
        "tensors": len(frame),
    }


def _run_child(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-gb", type=float, default=1.0, help="checkpoint size per side (GiB)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="stored dtype")
    p.add_argument("--threads", type=int, default=1, help="worker threads of the diff (the floor uses 1)")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs; the minimum is reported")
    p.add_argument("--no-cold", action="store_true", help="skip the cold-cache runs")
    p.add_argument("--tmpdir", help="where to generate (default: system temp)")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, *paths = args.child
        if kind == "generate":
            base, final, largest = generate(Path(paths[0]), float(paths[1]), paths[2])
            result = {"base": str(base), "final": str(final), "largest": largest}
        elif kind == "floor":
            result = _child_floor(Path(paths[0]))
        else:
            result = _child_diff(Path(paths[0]), Path(paths[1]), int(paths[2]))
        print(json.dumps(result))
        return 0

    root = Path(tempfile.mkdtemp(prefix="bench_sparsity_", dir=args.tmpdir))
    try:
        t0 = time.perf_counter()
        gen = _run_child("generate", str(root), str(args.size_gb), args.dtype)  # memory stays out of here
        base, final, largest = Path(gen["base"]), Path(gen["final"]), gen["largest"]
        size = sum(f.stat().st_size for f in _files(root))
        print(
            f"generated {size / MB:.0f} MB in total ({size / 2 / MB:.0f} MB per side, largest tensor "
            f"{largest / MB:.0f} MB) in {time.perf_counter() - t0:.1f}s under {root}"
        )
        _run_child("floor", str(root))  # make sure the page cache is warm
        floors, diffs = [], []
        for _ in range(args.repeats):
            floors.append(_run_child("floor", str(root))["seconds"])
            diffs.append(_run_child("diff", str(base), str(final), str(args.threads)))
        floor = min(floors)
        best = min(diffs, key=lambda d: d["seconds"])
        peak = max(d["peak_rss"] for d in diffs)
        target_rss = 3 * largest + 300 * MB
        gbps = size / MB / 1024 / best["seconds"]
        print(f"warm floor: {floor:.3f}s (runs {', '.join(f'{x:.3f}' for x in floors)})")
        runs = ", ".join(f"{d['seconds']:.3f}" for d in diffs)
        print(
            f"warm diff:  {best['seconds']:.3f}s (runs {runs}), "
            f"{args.threads} thread(s), {best['tensors']} tensors, "
            f"{best['numel'] / 1e6:.0f}M elements per side, {gbps:.2f} GB/s"
        )
        print(f"throughput_ratio={floor / best['seconds']:.2f} (target >= 0.5; floor_time / diff_time, warm)")
        print(
            f"peak_rss_ratio={peak / target_rss:.2f} (target <= 1; peak RSS {peak / MB:.0f} MB, of which "
            f"{best['rss_after_imports'] / MB:.0f} MB after imports, vs 3 x {largest / MB:.0f} MB + 300 MB "
            f"= {target_rss / MB:.0f} MB)"
        )
        if not args.no_cold:
            evict(root)
            cold_floor = _run_child("floor", str(root))["seconds"]
            evict(root)
            cold_diff = _run_child("diff", str(base), str(final), str(args.threads))["seconds"]
            print(
                f"cold (after fadvise DONTNEED): floor {cold_floor:.3f}s, diff {cold_diff:.3f}s, "
                f"ratio {cold_floor / cold_diff:.2f}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
