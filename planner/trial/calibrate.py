"""Refit a cluster spec so the estimate meets a trial run's measured time.

One knob, the one that dominates the spec's time, found by bisection on a log scale:
on CPU processes the framework overhead (op, DTensor, DP-unit and TP-module figures
scaled together: `scale_host_overheads`), on GPUs the `matmul_efficiency`.
`write_calibrated` saves the fitted spec atomically, or writes nothing.
"""

from __future__ import annotations

import dataclasses
import math
import os

from cost_models.clusters import get_cluster
from cost_models.estimate import estimate
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.plan import PlanDocument
from planner.trial.predict import plan_graph
from planner.trial.records import ValidationResult

# Bounds of the fitted matmul efficiency (ClusterSpec accepts (0, 1]).
MIN_EFFICIENCY, MAX_EFFICIENCY = 1e-4, 1.0
# Bounds of the fitted framework-overhead scale on CPU processes.
MIN_HOST_SCALE, MAX_HOST_SCALE = 1e-3, 1e3
BISECTION_STEPS = 60  # halvings of the log-scale interval: far below any figure's precision


def scale_host_overheads(spec: ClusterSpec, scale: float) -> ClusterSpec:
    """`spec` with every framework-overhead figure (op, DTensor, DP unit and tensor, TP
    module, optimizer per tensor) times `scale`: CPU processes that run `scale` times
    slower on the host."""
    return dataclasses.replace(
        spec, op_overhead_s=spec.op_overhead_s * scale,
        backward_op_overhead_s=None if spec.backward_op_overhead_s is None
        else spec.backward_op_overhead_s * scale,
        dtensor_op_overhead_s=spec.dtensor_op_overhead_s * scale,
        calibration=spec.calibration.with_host_overheads_scaled(scale))


def calibrate(doc: PlanDocument, graph, spec: ClusterSpec, measured_s: float) -> ClusterSpec:
    """`spec` refitted so `estimate` gives `measured_s` for this plan, by bisection on a log
    scale of the one knob that dominates the spec's time: on CPU processes the framework
    overhead (op, DTensor, DP-unit and TP-module figures scaled together), on GPUs the
    matmul efficiency."""
    if not (measured_s > 0 and math.isfinite(measured_s)):
        raise PlannerError(f"cannot calibrate on a measured time of {measured_s!r} s")
    if spec.host_bound:
        knob, low, high = "framework overhead scale", MIN_HOST_SCALE, MAX_HOST_SCALE

        def fitted(scale: float) -> ClusterSpec:
            return scale_host_overheads(spec, scale)
    else:
        knob, low, high = "matmul_efficiency", MIN_EFFICIENCY, MAX_EFFICIENCY

        def fitted(efficiency: float) -> ClusterSpec:
            return dataclasses.replace(spec, matmul_efficiency=efficiency)

    def predicted(value: float) -> float:
        if doc.plan.embeddings is not None:  # sharded tables: dense estimate + placement
            from planner.table_hybrid import estimate_hybrid
            return estimate_hybrid(graph, doc.plan, fitted(value))["iteration_seconds"]
        return estimate(graph, doc.plan, fitted(value)).iteration_seconds

    # The estimate rises with the overhead scale and falls with the efficiency.
    fast_end, slow_end = (low, high) if spec.host_bound else (high, low)
    fastest, slowest = predicted(fast_end), predicted(slow_end)
    if measured_s < fastest:
        raise PlannerError(
            f"measured {measured_s:.4g} s is faster than the estimate with {knob} "
            f"{fast_end:g} ({fastest:.4g} s): re-measure the peak FLOP/s (`planner "
            "profile-cluster`) instead of calibrating")
    if measured_s > slowest:
        raise PlannerError(
            f"measured {measured_s:.4g} s is slower than the estimate with {knob} "
            f"{slow_end:g} ({slowest:.4g} s): no {knob} explains it; check the links with "
            "`planner profile-cluster`")
    lo, hi = math.log(low), math.log(high)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        too_slow = predicted(math.exp(mid)) > measured_s
        if too_slow == spec.host_bound:
            hi = mid
        else:
            lo = mid
    value = math.exp((lo + hi) / 2)
    note = (f"{knob} {value:.4g} calibrated by `planner validate` on {doc.model_name} "
            f"({doc.plan}): measured {measured_s:.4g} s per iteration")
    return dataclasses.replace(fitted(value),
                               notes=(spec.notes + "; " if spec.notes else "") + note)


def write_calibrated(doc: PlanDocument, result: ValidationResult, out: str,
                     cluster: str | ClusterSpec | None = None,
                     model_spec: str | None = None) -> ClusterSpec:
    """Fit and save atomically (`ClusterSpec.save`); nothing is written when fitting fails."""
    if cluster is None:
        spec = ClusterSpec.from_dict(doc.cluster, "plan cluster")
    else:
        spec = cluster if isinstance(cluster, ClusterSpec) else get_cluster(cluster)
    fitted = calibrate(doc, plan_graph(doc, model_spec=model_spec), spec,
                       result.measured_iteration_seconds)
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise PlannerError(f"cannot write {out}: folder {directory} does not exist")
    fitted.save(out)
    return fitted
