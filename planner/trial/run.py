"""`validate_plan`: a whole trial run (see `planner.trial` for what each phase measures).

    result = validate_plan("plan.json", nproc=4, steps=5)
    result.to_json()   # {"ranks": [...], "predicted_iteration_seconds": ..., ...}
"""

from __future__ import annotations

import statistics

import torch

from cost_models.clusters import get_cluster
from cost_models.memory import check_plan_matches
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.plan import PlanDocument, load_plan, plan_to_json
from planner.trial.grad_check import check_grad_norms, grad_norm_rtol
from planner.trial.mixed_reference import MixedPrecision
from planner.trial.predict import host_op_reading, machine_slowdown, plan_graph, predict
from planner.trial.rank import MEMORY_STEPS, TIME_WARMUP_STEPS
from planner.trial.records import (RankPayload, RankResult, ValidationResult,
                                   busiest_cpu_step_seconds, unqueued_step_seconds)
from planner.trial.reference import (global_batches, has_dropout, loss_rtol, losses_match,
                                     reference_run, trial_max_grad_norm)
from planner.trial.spawn import spawn_ranks, start_rank_server

# Intra-op threads per rank. One, as the tests' ranks use: on this shared 2-core machine
# a 1-rank run with 2 OpenMP threads measured 0.6-1.9 s per gpt-tiny step (threads spin
# at barriers while the other core is taken) against ~0.03 s with one.
RANK_THREADS = 1
CHECK_STEPS = 3  # steps of the dropout-free run that checks the losses (at most)


def validate_plan(plan: str | PlanDocument, nproc: int, *, steps: int = 5,
                  cluster: str | ClusterSpec | None = None, progress=None,
                  memory_detail: int = 0, model_spec: str | None = None) -> ValidationResult:
    """Run `plan` on `nproc` local ranks; predicted vs measured memory and time.
    `memory_detail` > 0 lists that many of the largest storages live at each rank's
    measured peak (CPU tracker only). `model_spec`: the MODEL the user typed (needed for
    a factory: a plan file never imports one)."""
    say = progress or (lambda _msg: None)
    from planner.models import plan_model_spec

    doc = load_plan(plan) if not isinstance(plan, PlanDocument) else plan
    path = plan if isinstance(plan, str) else "<plan>"
    model = plan_model_spec(doc, model_spec)  # the MODEL argument that rebuilds it
    if steps < 1:
        raise PlannerError(f"--steps must be >= 1, got {steps}")
    if nproc != doc.plan.world_size:
        raise PlannerError(f"plan {path} needs {doc.plan.world_size} processes but --nproc is "
                           f"{nproc}: pass --nproc {doc.plan.world_size}, or re-plan with "
                           f"`planner plan {model} --cluster local --gpus-per-node "
                           f"{nproc}`")
    spec = None
    if cluster is not None:
        spec = cluster if isinstance(cluster, ClusterSpec) else get_cluster(cluster)
    start_rank_server(model)  # its imports overlap the tracing below
    say(f"tracing {doc.model_name} (micro-batch {doc.graph_micro_batch}, {doc.graph_dtype})")
    graph = plan_graph(doc, path, model_spec)
    check_plan_matches(graph, doc.plan)  # TP degrees that do not divide: before any rank starts
    prediction = predict(doc, graph, spec)
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= nproc
    backend = "nccl" if use_cuda else "gloo"
    total_steps = 1 + MEMORY_STEPS + TIME_WARMUP_STEPS + steps
    dropout = has_dropout(model, 1, doc.seq_len)
    check_steps = min(total_steps, CHECK_STEPS) if dropout else 0
    mixed = MixedPrecision.of(doc.plan, graph)  # bf16: gradients against its policy
    grad_rtol = grad_norm_rtol(doc.plan.precision)  # None: fp16, losses only
    batches = global_batches(model, doc.plan.global_batch, doc.seq_len,
                             max(total_steps, check_steps))
    payload = RankPayload(plan_json=plan_to_json(doc), plan_path=path, model=model,
                          seq_len=doc.seq_len, graph=graph, batches=batches,
                          memory_steps=MEMORY_STEPS, steps=steps, backend=backend,
                          check_steps=check_steps, threads=RANK_THREADS,
                          memory_detail=memory_detail, grad_check=grad_rtol is not None)
    say(f"running {total_steps} steps on {nproc} {backend} ranks")
    results = spawn_ranks(payload, nproc)
    # after the ranks: no CUDA context of this process holds their GPU's memory meanwhile
    host_op = host_op_reading(spec or ClusterSpec.from_dict(doc.cluster, "plan cluster"))
    check = results[0].check_losses
    say("single-process reference")
    where = "cuda" if use_cuda else "cpu"
    reference = reference_run(model, doc.seq_len, doc.plan.optimizer, batches, len(check),
                              doc.plan.embeddings, device=where,
                              optimizer_impl=doc.plan.optimizer_impl,
                              max_grad_norm=trial_max_grad_norm(doc.plan))
    want, grads = reference.losses, None
    if grad_rtol is not None:
        if mixed is not None:
            say("single-process reference under the plan's precision policy (first step)")
            reference = reference_run(model, doc.seq_len, doc.plan.optimizer, batches, 1,
                                      doc.plan.embeddings, mixed, device=where,
                                      optimizer_impl=doc.plan.optimizer_impl,
                                      max_grad_norm=trial_max_grad_norm(doc.plan))
        got = {name: norm for r in reversed(results) for name, norm in r.grad_norms.items()}
        grads = check_grad_norms(got, reference.grad_norms,
                                 [layer.name for layer in graph.layers], grad_rtol)
    per_step = [max(r.step_seconds[i] for r in results) for i in range(steps)]
    rtol = loss_rtol(doc.plan.precision)
    ranks = tuple(RankResult(r, prediction.peak_bytes_by_rank[r], results[r].peak_bytes,
                             results[r].peak_tensors) for r in range(nproc))
    return ValidationResult(
        plan=str(doc.plan), model=doc.model_name, nproc=nproc, backend=backend, ranks=ranks,
        predicted_iteration_seconds=float(prediction.iteration_seconds),
        measured_iteration_seconds=statistics.median(per_step),
        loss_matches_reference=losses_match(check, want, rtol), loss_rtol=rtol,
        losses=results[0].losses,
        reference_losses=tuple(want), step_seconds=tuple(per_step), checked_losses=check,
        predicted_time=prediction.time_breakdown, prediction_source=prediction.source,
        machine_slowdown=machine_slowdown(host_op), host_op_s=host_op,
        rank_phase_seconds=tuple(r.phase_seconds for r in results),
        predicted_embedding=prediction.embedding, grad_check=grads,
        unqueued_step_seconds=unqueued_step_seconds(list(results)),
        busiest_cpu_step_seconds=busiest_cpu_step_seconds(list(results)))
