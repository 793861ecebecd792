"""Each layer's forward (and backward) on the main thread's CPU clock against its price (issue 17:
gpt tp2+sp on 2 ranks read 35.7 ms of compute CPU per step where 20.3 ms was priced).

A plan file runs on spawned gloo ranks (one thread each, as `planner validate` runs them);
forward pre- and post-hooks on each layer read `time.thread_time()`, and the loss call is
timed the same way. The price is `compute.layer_compute`'s forward seconds on the spec
(host work on plain tensors, TP modules' DTensor work, SP norms' DTensor ops; stretched by
the core share where processes outnumber cores), beside which the forward TP collectives'
seconds (`comm.tp_comm_s`) are shown apart: the measured CPU holds their calling-thread
part (funcol issue, `wait_tensor`), which the comm model prices inside them. Thread CPU
moves far less with load than wall time, but the spec's figures were read at its own
load: compare on a quiet machine with a spec profiled there.

    .venv/bin/python bench/bench_layer_cpu.py --plan plan.json --spec spec.json [--steps 10]

Read on 2026-11-25 at load ~1, gpt-tiny tp2+sp dp1 (bench_validate's gpt-tp2-dp2-sp pins
at dp 1) on a spec profiled minutes before: blocks 2.6-2.9 ms measured against 2.90 ms
priced with the SP group figure (2.28 without it); the vocab-parallel embedding 0.7 ms
against 0.38; the head 0.16 ms plus its loss_parallel cross-entropy 1.0 ms against 0.33
(the loss's ops priced on plain tensors with the head; its DTensor dispatch and three
funcol all-reduces' calling-thread CPU not yet priced apart); step 35-36 ms. With
--backward: blocks' backward 2.95-3.07 ms against 2.94 priced (2.32 without the SP group
figure), forward 2.56-2.73 against 2.90.

A checkpointed layer's backward row holds its recompute (priced backward + recompute), and
a "LAST+loss" row sets the last layer's and the loss's forward CPU together against the
last layer's price (a loss-parallel head's DTensor loss: `tp_host.vocab_edge_seconds`).
Read on 2026-11-25 at load 4-7 (spec with the vocab/loss/SAC figures, `tp_probes`,
`vocab_probes`): gpt tp2+sp dp1, head+loss 1.39 ms against 1.22; with SELECTIVE the blocks
read 1.9 ms more forward and 4.6 more backward+recompute CPU than without (gpt-tiny on 1
rank: 0.4 and 1.0), against 0.6 and 2.3 priced: SAC on a TP+SP block costs more than its
Linear pairs' probe holds (torch.profiler: the recompute reruns 33 `Redistribute` a step
at ~0.27 ms each). gpt-tp2-dp2-sp-sel on 4 ranks: step 88 ms of CPU against 53 for
gpt-tp2-dp2-sp.

Read on 2026-11-25 at load 4-6 with the whole-block SAC figure (`block_probes`, 1.76 ms per
SP group on the 2-rank spec): gpt tp2+sp dp1 SELECTIVE minus NONE, per block, forward 1.14
ms measured against 0.69 priced, backward+recompute 3.58 against 4.79 (5.48 priced in all
against 4.72; before it 2.9 against 6.5). The embedding's forward 1.31 ms against 0.51 is
mostly its all-reduce's wait burning the caller's CPU (`vocab_probes`' docstring), priced
in its comm. gpt-tp2-dp2-sp on 4 ranks: blocks' forward 3.8-4.3 ms of CPU, as on 2 ranks
(3.6-4.7), against 5.85 priced (2.93 x the host share 2). With the block figure split by
pass (spec at load ~5: 1.24 ms per group, 0.28 of it forward), read at load 2-4: SAC per
block forward 1.48 ms against 1.16, backward+recompute 4.04 against 2.97, each ~25-30%
under as the same spec's NONE blocks are (3.1-3.5 ms against 2.36 forward).

Prints a table, writes bench/results/layer_cpu.json, exits 1 when a layer with TP
modules misses its priced forward by more than LAYER_TARGET.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from planner.fmt import table  # noqa: E402

LAYER_TARGET = 0.25  # bench_validate's time target, applied to each layer's forward
WARMUP_STEPS = 3


def _rank(rank: int, world: int, port: int, payload, steps: int, names, out: str,
          backward: bool) -> None:
    torch.set_num_threads(1)  # planner.trial.run.RANK_THREADS
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    from planner.trial.rank import _build

    pm = _build(payload, torch.device("cpu"), without_dropout=False)
    spent = dict.fromkeys([*names, "loss"], 0.0)
    started: dict[str, float] = {}
    modules = dict(pm.module.named_modules())
    for name in names:
        modules[name].register_forward_pre_hook(
            lambda _m, _a, name=name: started.__setitem__(name, time.thread_time()))
        modules[name].register_forward_hook(
            lambda _m, _a, _o, name=name: spent.__setitem__(
                name, spent[name] + time.thread_time() - started[name]))
    for name in names[1:] if backward else ():  # the first layer's inputs are ids: no grads
        key = f"backward:{name}"
        spent[key] = 0.0
        modules[name].register_full_backward_pre_hook(
            lambda _m, _g, key=key: started.__setitem__(key, time.thread_time()))
        modules[name].register_full_backward_hook(
            lambda _m, _gi, _go, key=key: spent.__setitem__(
                key, spent[key] + time.thread_time() - started[key]))
    loss_fn = pm.loss_fn

    def timed_loss(*args, **kwargs):
        start = time.thread_time()
        loss = loss_fn(*args, **kwargs)
        spent["loss"] += time.thread_time() - start
        return loss

    pm.loss_fn = timed_loss
    batches = payload.batches
    for k in range(WARMUP_STEPS):
        pm.train_step(*batches[k % len(batches)])
    spent.update(dict.fromkeys(spent, 0.0))
    dist.barrier()
    start = time.thread_time()
    for k in range(steps):
        pm.train_step(*batches[k % len(batches)])
    step_s = (time.thread_time() - start) / steps
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"step_s": step_s, **{k: v / steps for k, v in spent.items()}}, f)
    dist.barrier()  # nobody tears gloo down while a peer still uses it
    dist.destroy_process_group()


def measure(plan_path: str, steps: int, backward: bool) -> tuple[dict, tuple]:
    """(rank 0's per-layer forward and step thread CPU seconds, the plan's layers)."""
    import socket
    import tempfile

    from ir.plan import load_plan, plan_to_json
    from planner.models import plan_model_spec
    from planner.trial.predict import plan_graph
    from planner.trial.records import RankPayload
    from planner.trial.reference import global_batches

    doc = load_plan(plan_path)
    model = plan_model_spec(doc, None)
    graph = plan_graph(doc, plan_path, None)
    payload = RankPayload(plan_json=plan_to_json(doc), plan_path=plan_path, model=model,
                          seq_len=doc.seq_len, graph=graph, batches=global_batches(
                              model, doc.plan.global_batch, doc.seq_len, 8),
                          memory_steps=0, steps=steps, backend="gloo", check_steps=0,
                          threads=1, memory_detail=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rank0.json")
        mp.start_processes(_rank, args=(doc.plan.world_size, port, payload, steps,
                                        [layer.name for layer in graph.layers], out,
                                        backward),
                           nprocs=doc.plan.world_size, start_method="spawn")
        with open(out) as f:
            return json.load(f), (doc, graph)


def main(argv: list[str] | None = None) -> int:
    from cost_models.comm import tp_comm_s
    from cost_models.common import layer_configs
    from cost_models.compute import layer_compute
    from ir.cluster import ClusterSpec

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--backward", action="store_true",
                        help="also time each layer's backward (full backward hooks on every "
                             "layer but the first; they add a little to the forward)")
    args = parser.parse_args(argv)
    measured, (doc, graph) = measure(args.plan, args.steps, args.backward)
    with open(args.spec) as f:
        spec = ClusterSpec.from_dict(json.load(f))
    configs = layer_configs(graph, doc.plan, spec.device)
    rows, records, missed = [], [], []
    for layer, strategy, config in zip(graph.layers, doc.plan.layer_strategies, configs):
        cost = layer_compute(layer, strategy, spec, config)
        comm = tp_comm_s(layer, strategy, spec, config)
        # a checkpointed layer's backward hooks hold its recompute (the unpack hook reruns
        # the forward inside the layer's backward)
        for pass_name, priced_s, comm_s, key in (
                ("forward", cost.forward_s, comm[0], layer.name),
                ("backward", cost.backward_s + cost.recompute_s, comm[1],
                 f"backward:{layer.name}")):
            if key not in measured:
                continue
            meas_s = measured[key]
            error = priced_s / meas_s - 1 if meas_s else 0.0
            if layer.tp_candidates and strategy.tp > 1 and abs(error) > LAYER_TARGET:
                missed.append(f"{layer.name} {pass_name}")
            records.append({"layer": layer.name, "pass": pass_name, "priced_s": priced_s,
                            "tp_comm_s": comm_s, "measured_s": meas_s})
            rows.append([layer.name, pass_name, str(strategy), f"{1e3 * priced_s:.2f}",
                         f"{1e3 * comm_s:.2f}", f"{1e3 * meas_s:.2f}", f"{100 * error:+.0f}%"])
    rows.append(["loss", "forward", "", "", "", f"{1e3 * measured['loss']:.2f}", ""])
    # the loss is priced with the last layer (its plain ops; a loss-parallel head's DTensor
    # loss: `tp_host.vocab_edge_seconds`): the two forwards together against that price
    last = next(r for r in reversed(records) if r["pass"] == "forward")
    both_s = last["measured_s"] + measured["loss"]
    rows.append([f"{last['layer']}+loss", "forward", "", f"{1e3 * last['priced_s']:.2f}", "",
                 f"{1e3 * both_s:.2f}", f"{100 * (last['priced_s'] / both_s - 1):+.0f}%"])
    rows.append(["step", "all", "", "", "", f"{1e3 * measured['step_s']:.2f}", ""])
    print(table(["layer", "pass", "strategy", "priced ms", "tp comm ms", "meas CPU ms",
                 "error"], rows, right={3, 4, 5, 6}))
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/layer_cpu.json", "w") as f:
        json.dump({"plan": args.plan, "spec": args.spec, "target": LAYER_TARGET,
                   "layers": records, "loss_s": measured["loss"],
                   "step_s": measured["step_s"]}, f, indent=1)
    if missed:
        print(f"CPU off its price by more than {LAYER_TARGET:.0%}: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
