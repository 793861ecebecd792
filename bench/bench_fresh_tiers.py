"""What a CPU kernel pays to write its output into a block that is not in L2, by where the
block last lived: `cost_models.fresh_output`'s probe (an add into shuffled blocks of a
pool over the same add into one hot block) on pools from inside L2 to past the LLC.

The table behind `cost_models.cache_tiers`: pools within L2 read ~0 extra, pools
inside the last-level cache one rate (the `fresh_output_llc` tier, probed on LLC / 8),
pools past it another (the `fresh_output` tier, probed on 2 x LLC). One thread, thread
clock (`profile_device.seconds_per_call`); the LLC from sysfs (`fresh_output
.last_level_cache_bytes`).

Target: at each output size the extra seconds per KiB ordered by tier, the LLC tier's
pool at most TIER_RATIO of the DRAM tier's (the cache tier is worth pricing apart), at
output sizes of at most 128 KiB (larger blocks' "hot" add already leaves L2); exit 1
otherwise. Read on a loaded host the order holds; the ratios move.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_fresh_tiers.py
        [--layers llama-tiny,cnn-small,t5-tiny | --reuse llama-tiny:16:norm,...]

--reuse llama-tiny:16:norm,...: instead, each layer run as `planner profile` runs it
(`layer_profile.StepNeighbours` around it, four rounds) under a dispatch mode that counts
every kernel op's bytes (inputs read, outputs written, whole storages) and, per 4 KiB page,
the count when it was last touched: each output's reuse distance (bytes moved since
its block was last touched: Mattson et al. 1970) beside the model's (`cache_tiers
.pass_reuse_bytes`). Counts, not timings, but glibc's heap state moves
them from run to run (2026-11-25, five runs): llama-tiny's norm at mb 16 writes one forward
output into a block touched 0.01-0.5 MiB before, the other two 0.1-13 MiB after (model
0.9); backward medians 0-3.0 MiB with a tail to 12-17 MiB (model 3.0); its block's
outputs at medians of 0.5-3.6 MiB forward (model 14.3) and 1-3.3 backward (model 25.4),
many at 0. None past twice the LLC: the DRAM tier prices these layers' outputs as
fetched from further than they are (the block's fresh price stands for more than its
outputs: bench_kernel_sequence's code-cold and rest columns).

--layers: instead, bench_kernel_model's rows for those models (its profile and its
measurements), each priced twice on the same measurement: with the tier and on the spec
with its tier removed (every fresh output at the DRAM rate, the pricing before it); the
counts over 15% both ways (exit 1 where the tier has more). Writes
bench/results/fresh_tiers.json (--layers: fresh_tiers_layers.json; --reuse:
fresh_tiers_reuse.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.cache_tiers import (LLC_TIER_POOL_DIVISOR, llc_pool_bytes,  # noqa: E402
                                     probe_fresh_output_llc, tiered)
from cost_models.fresh_output import (FRESH_POOL_LLC_MULTIPLE, last_level_cache_bytes,  # noqa: E402
                                      probe_fresh_output)
from cost_models.profile_device import seconds_per_call  # noqa: E402
from planner.fmt import table  # noqa: E402

KiB, MiB = 2**10, 2**20
OUTPUT_BYTES = (32 * KiB, 128 * KiB, 512 * KiB)
TARGET_MAX_OUTPUT_BYTES = 128 * KiB
TIER_RATIO = 0.6  # the LLC tier's ns/KiB at most this share of the DRAM tier's
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "fresh_tiers.json")


def ns_per_kib(nbytes: int, pool_bytes: int) -> float:
    """Extra ns per KiB written into blocks of `pool_bytes` over one hot block (0 where
    the probe found no difference)."""
    points = probe_fresh_output("cpu", seconds_per_call, pool_bytes, sizes=(nbytes,))
    return 0.0 if not points else KiB / points[0].gbps


PAGE_BYTES = 4096  # the reuse count's granule: a page (lines within it go together)


def _storages(values) -> list[tuple[int, int]]:
    """(address, bytes) of the CPU storages among `values` (nested lists included)."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.numel():
            out.append((v.untyped_storage().data_ptr(), v.untyped_storage().nbytes()))
        elif isinstance(v, (list, tuple)):
            out.extend(_storages(v))
    return out


def reuse_rows(rows: list[str]) -> int:
    """Each output's reuse distance as `planner profile` runs the layer (module docstring)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from bench.bench_kernel_model import traced_graph
    from cost_models.cache_tiers import pass_reuse_bytes
    from cost_models.common import StepConfig
    from cost_models.layer_profile import StepNeighbours
    from ir.graph_measurer import _clear_grads
    from ir.kernel_recorder import NO_KERNEL_OPS
    from ir.stand_in import real_factory
    from ir.strategy import Precision

    class Reuse(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.moved, self.touched, self.outputs = 0, {}, None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func.is_view or func.overloadpacket.__name__ in NO_KERNEL_OPS:
                return out
            written = _storages([out])
            if self.outputs is not None:
                for address, nbytes in written:
                    seen = [self.touched[p] for p in range(address // PAGE_BYTES,
                                                           (address + nbytes) // PAGE_BYTES)
                            if p in self.touched]
                    self.outputs.append((nbytes, self.moved - max(seen) if seen else None))
            for address, nbytes in _storages([*args, *kwargs.values()]) + written:
                self.moved += nbytes
                for p in range(address // PAGE_BYTES, (address + nbytes) // PAGE_BYTES + 1):
                    self.touched[p] = self.moved
            return out

    results = []
    for row in rows:
        model, micro_batch, name = row.split(":")
        graph, measurer = traced_graph(model, int(micro_batch))
        index = [layer.name for layer in graph.layers].index(name)
        layer, factory = graph.layers[index], real_factory("cpu")
        state = measurer.layer_state(index, factory)
        module = measurer.layer_module(index, state)
        neighbours = StepNeighbours(measurer, index, factory, graph.layers, "cpu")
        config = StepConfig(micro_batch=int(micro_batch), graph_micro_batch=graph.micro_batch,
                            graph_dtype=graph.dtype, precision=Precision.FP32,
                            seq_len=graph.seq_len, device_type="cpu")
        mode, passes = Reuse(), {}
        with mode:
            for _ in range(4):  # as time_layer's loop; the last round's outputs are read
                _clear_grads(state)
                inputs = measurer.fresh_inputs(index, state, factory)
                neighbours.before_forward()
                mode.outputs = passes["fwd"] = []
                returned = module(*inputs)
                mode.outputs = None
                roots = measurer.module_roots(index, returned)
                seeds = [torch.ones_like(t) for t in roots]
                neighbours.before_backward()
                mode.outputs = passes["bwd"] = []
                torch.autograd.backward(roots, seeds)
                mode.outputs = None
                del inputs, returned, roots, seeds
        for phase, records in (("fwd", layer.kernels.forward), ("bwd", layer.kernels.backward)):
            outputs = [(n, d) for n, d in passes[phase] if n >= PAGE_BYTES]
            total = sum(n for n, _ in outputs)
            median, running = None, 0
            for n, d in sorted(outputs, key=lambda o: (o[1] is None, o[1] or 0)):
                running += n
                if running >= total / 2:
                    median = d
                    break
            results.append({"row": row, "phase": phase, "output_bytes": total,
                            "median_reuse_bytes": median,
                            "reuse_bytes": sorted(d for _, d in outputs if d is not None),
                            "never_touched_bytes": sum(n for n, d in outputs if d is None),
                            "model_reuse_bytes": pass_reuse_bytes(records, config, 1.0)})
    print(table(["layer", "pass", "outputs KiB", "median reuse MiB", "model MiB",
                 "reuse distances MiB (smallest 12)"],
                [[r["row"], r["phase"], r["output_bytes"] // KiB,
                  "-" if r["median_reuse_bytes"] is None
                  else f"{r['median_reuse_bytes'] / MiB:.2f}",
                  f"{r['model_reuse_bytes'] / MiB:.2f}",
                  " ".join(f"{d / MiB:.2f}" for d in r["reuse_bytes"][:12])] for r in results]))
    path = RESULTS.replace(".json", "_reuse.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"bench": "fresh_tiers_reuse", "rows": results}, f, indent=2)
    print(f"wrote {path}")
    return 0


def layer_rows(models: list[str]) -> int:
    """bench_kernel_model's rows priced with and without the tier (module docstring)."""
    import dataclasses

    from bench.bench_kernel_model import (MICRO_BATCHES, REPEATS, TARGET_ERROR, WARMUP,
                                          gemm_shapes, measure_model, traced_graph)
    from cost_models.common import StepConfig
    from cost_models.compute import layer_compute
    from cost_models.profile_device import profile_device
    from ir.strategy import LayerStrategy, Precision

    graphs = {(m, b): traced_graph(m, b) for m in models for b in MICRO_BATCHES}
    spec, cal = profile_device("cpu", extra_gemm_shapes=gemm_shapes(
        g for g, _ in graphs.values()))
    torch.set_num_threads(1)
    if not tiered(cal):  # a profile-device that does not write the tier: probe it here
        pool = llc_pool_bytes()
        cal = dataclasses.replace(cal, fresh_output_llc_pool_bytes=pool, memory_kernels=(
            *cal.memory_kernels, *probe_fresh_output_llc("cpu", seconds_per_call, pool)))
        spec = dataclasses.replace(spec, kernel_calibration=cal)
    untiered = dataclasses.replace(spec, kernel_calibration=dataclasses.replace(
        cal, fresh_output_llc_pool_bytes=0.0))
    rows = []
    for (model, micro_batch), (graph, measurer) in graphs.items():
        config = StepConfig(micro_batch=micro_batch, graph_micro_batch=graph.micro_batch,
                            graph_dtype=graph.dtype, precision=Precision.FP32,
                            seq_len=graph.seq_len, device_type="cpu")
        by_name = {layer.name: layer for layer in graph.layers}
        for row in measure_model(model, micro_batch, graph, measurer, spec, WARMUP, REPEATS):
            old = layer_compute(by_name[row["layer"]], LayerStrategy(), untiered, config)
            row["untiered_s"] = old.forward_s if row["phase"] == "fwd" else old.backward_s
            row["untiered_error"] = row["untiered_s"] / row["measured_s"] - 1.0
            rows.append(row)
    print(table(["model", "layer", "batch", "pass", "measured us", "tiered us", "error",
                 "untiered us", "error"],
                [[r["model"], r["layer"], r["micro_batch"], r["phase"],
                  f"{r['measured_s'] * 1e6:.1f}", f"{r['predicted_s'] * 1e6:.1f}",
                  f"{r['error']:+.0%}", f"{r['untiered_s'] * 1e6:.1f}",
                  f"{r['untiered_error']:+.0%}"] for r in rows]))
    over = sum(abs(r["error"]) > TARGET_ERROR for r in rows)
    over_untiered = sum(abs(r["untiered_error"]) > TARGET_ERROR for r in rows)
    load = os.getloadavg()[0]
    print(f"\n{len(rows)} layer passes over {TARGET_ERROR:.0%}: {over} tiered, "
          f"{over_untiered} untiered (same measurements); load average {load:.1f}.")
    path = RESULTS.replace(".json", "_layers.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"bench": "fresh_tiers_layers", "load_average_1min": load, "rows": rows,
                   "over_tiered": over, "over_untiered": over_untiered}, f, indent=2)
    print(f"wrote {path}")
    return 1 if over > over_untiered else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default=None, help="comma-separated zoo presets")
    parser.add_argument("--reuse", default=None, help="model:micro_batch:layer,...")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.reuse:
        return reuse_rows(args.reuse.split(","))
    if args.layers:
        return layer_rows(args.layers.split(","))
    llc = last_level_cache_bytes()
    pools = {"LLC/64": llc // 64, "2 MiB": 2 * MiB, "LLC/8 (tier)": llc // LLC_TIER_POOL_DIVISOR,
             "LLC/2": llc // 2, "2 LLC (tier)": FRESH_POOL_LLC_MULTIPLE * llc, "8 LLC": 8 * llc}
    rows = [{"output_bytes": n, "pool": name, "pool_bytes": pool,
             "ns_per_kib": ns_per_kib(n, pool)} for n in OUTPUT_BYTES
            for name, pool in pools.items()]
    print(table(["output KiB", "pool", "pool MiB", "ns per KiB"],
                [[r["output_bytes"] // KiB, r["pool"], f"{r['pool_bytes'] / MiB:.1f}",
                  f"{r['ns_per_kib']:.1f}"] for r in rows]))
    missed = []
    for n in OUTPUT_BYTES:
        if n > TARGET_MAX_OUTPUT_BYTES:
            continue
        at = {r["pool"]: r["ns_per_kib"] for r in rows if r["output_bytes"] == n}
        llc_s, dram_s = at["LLC/8 (tier)"], at["2 LLC (tier)"]
        if not llc_s <= TIER_RATIO * dram_s:
            missed.append(n)
    load = os.getloadavg()[0]
    print(f"\nLLC {llc / MiB:.0f} MiB (sysfs); output sizes whose LLC tier is not under "
          f"{TIER_RATIO:.0%} of the DRAM tier: {[n // KiB for n in missed] or 'none'}; "
          f"load average {load:.1f}.")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"bench": "fresh_tiers", "last_level_cache_bytes": llc,
                   "load_average_1min": load, "tier_ratio": TIER_RATIO, "rows": rows}, f,
                  indent=2)
    print(f"wrote {RESULTS}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
