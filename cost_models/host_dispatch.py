"""Host seconds of one layer's dispatch per pass (the framework's share of a step on CPU
processes, the overhead-bound floor on GPUs): whole ops at the spec's per-op figures, or,
where the device kit measured them in parts (`cost_models.host_probes`,
`cost_models.host_excess`, `cost_models.sequence_probes`), views, other ops, module calls,
fx nodes, autograd nodes, each op's fixed excess, in-sequence and cold-code terms apiece.
`cost_models.compute.layer_compute` adds them to the kernels' time."""

from __future__ import annotations

from ir.cluster import ClusterSpec
from ir.layer import Layer

from cost_models.layer_memo import per_layer
from cost_models.host_excess import backward_nodes, records_excess_seconds
from cost_models.host_probes import HOST_OP_CHAIN_DISTINCT_OPS
from cost_models.sequence_probes import in_sequence_extra_per_op_s

# `KernelRecord.dtype` names of floating tensors (float32, float16, bfloat16, float64)
FLOATING_DTYPES = ("float", "bfloat")


def host_op_seconds(cluster: ClusterSpec, on_dtensors: bool = False,
                    backward: bool = False) -> float:
    """Framework seconds per dispatched op: forward ops at `op_overhead_s`, backward ops
    (`backward=True`) at `ClusterSpec.backward_host_op_s`, DTensor ops the extra on top."""
    base = cluster.backward_host_op_s if backward else cluster.op_overhead_s
    return base + (cluster.dtensor_op_overhead_s if on_dtensors else 0.0)


@per_layer
def forward_host_seconds(layer: Layer, cluster: ClusterSpec) -> float:
    """Host seconds of one forward's dispatch. Where the device kit measured it in parts
    and the layer's module calls were counted: views x `view_host_op_s` + other ops x
    `forward_host_op_s` (as functions) + module calls x `module_call_host_s`; where the
    kit measured `python_node_host_s` (its per-op figures then net of the ops' fixed
    excess), each forward op's per-call excess (`host_op_excess`: exact GELU's ~5 us) +
    fx call nodes that dispatch nothing x per-node (`python_nodes_fwd`), fx nodes that
    dispatch only views x (`python_view_host_op_s` - `view_host_op_s`), their first view
    called from Python (`python_view_nodes_fwd`); where it measured
    `forward_node_host_s` (its per-op figures then grad-off), the autograd nodes the
    forward records x per-node (`autograd_nodes_fwd`, else one per floating-point op:
    `host_excess.backward_nodes`); where it measured `in_sequence_op_host_s`, what the
    ops pay for running among the layer's distinct ops (`distinct_ops_fwd`: the low
    segment up to the knee, the slope beyond), less what they pay among the host probe
    chain's (`host_probes.HOST_OP_CHAIN_DISTINCT_OPS`: its per-op, per-node and per-call
    figures are that chain's, run in order, 1.4-1.6x its calls' tight loops here; a Linear then a
    ReLU ran 1.24-1.30x theirs, thread clock, load 2.3, 2026-11-26; the other figures
    above are tight loops'); + each op given a Python
    number it wraps (`KernelRecord.scalar_operand`) x `scalar_operand_float_host_s` on a
    floating tensor, `scalar_operand_int_host_s` on an integer one (0 in kits without
    them); where it measured
    the entry probe, what the layer pays for starting after the step's other work
    (`cold_entry_seconds`: an entry + the distinct ops the layers before did not run x
    a slope, by the work between; every figure above is a warm run's); where a whole
    step's ops stay in the caches (`Layer.step_warm`), the least work's
    (`warm_step_entry_seconds`). A kit without parts: ops
    x `host_op_seconds`. Views are the records the host dispatches as metadata
    (`KernelRecord.host_view`: an allocation, recorded as a view, is an op here). (Pricing ops per Python-level call and per op inside a C++
    composite instead missed more layers: bench/bench_host_ab.py, 2026-11-25.)"""
    cal = cluster.kernel_calibration
    calls = layer.kernels.forward_module_calls if layer.kernels is not None else None
    # measured in parts: the view figure is timed directly; the per-op one is what remains
    # of a function chain after its excess and nodes, ~0.2-0.6 us here, 0 on a loaded host
    measured_in_parts = cal is not None and (cal.view_host_op_s > 0 or cal.forward_host_op_s > 0)
    if not measured_in_parts or calls is None:
        return layer.ops_fwd * host_op_seconds(cluster)
    # cost_models.host_probes.host_op_seconds_by_pass: function chain and views
    views = sum(r.count for r in layer.kernels.forward if r.host_view)
    host_s = (views * cal.view_host_op_s + (layer.ops_fwd - views) * cal.forward_host_op_s
              + calls * cal.module_call_host_s)
    # a view-only fx node's first view is called from Python (host_excess.InternalDispatch)
    host_s += layer.python_view_nodes_fwd * max(0.0, cal.python_view_host_op_s
                                                 - cal.view_host_op_s)
    if cal.python_node_host_s > 0:  # host_excess: nodes and excess apart
        host_s += (layer.python_nodes_fwd * cal.python_node_host_s
                   + records_excess_seconds(layer.kernels.forward, cal.host_excess_s))
    host_s += wrapped_number_host_seconds(layer.kernels.forward, cal)
    if cal.forward_node_host_s > 0:  # grad_fns recorded (host_probes.host_op_seconds_by_pass)
        recorded = layer.autograd_nodes_fwd or backward_nodes(layer.kernels.forward, 0)
        host_s += recorded * cal.forward_node_host_s
    # In sequence (cost_models.sequence_probes.in_sequence_cost): every op pays for the
    # layer's distinct ops (up to the knee, beyond it), less what the non-view ops' figure
    # holds already (the probe chain's own, run in order; the view figure is a tight
    # loop's); a layer whose distinct ops were not counted (0) pays none
    line = (cal.in_sequence_op_host_s, cal.in_sequence_knee_distinct_ops,
            cal.in_sequence_low_op_host_s)
    if layer.distinct_ops_fwd > 0:
        host_s += (layer.ops_fwd * in_sequence_extra_per_op_s(*line[:2], layer.distinct_ops_fwd,
                                                              line[2])
                   - (layer.ops_fwd - views) * in_sequence_extra_per_op_s(
                       *line[:2], HOST_OP_CHAIN_DISTINCT_OPS, line[2]))
    # a whole step's ops stay in the caches (ir.op_count.step_evicts): the least work's
    # entry; kits before the entry probe price as they did (either entry figure says it
    # ran: one fit may clamp to 0)
    entry_probed = cal.cold_entry_host_s > 0 or cal.cold_entry_after_backward_host_s > 0
    if layer.step_warm and entry_probed:
        return host_s + warm_step_entry_seconds(layer, cal)
    return host_s + cold_entry_seconds(layer, cal)


def wrapped_number_host_seconds(records, cal) -> float:
    """What `records`' calls pay for a number they wrap into a tensor
    (`KernelRecord.scalar_operand`): x `scalar_operand_float_host_s` on a floating tensor,
    `scalar_operand_int_host_s` on an integer one (0 in kits without them)."""
    # the kit's per-call figures of a wrapped number: the probe
    # `cost_models.scalar_operand_probes.scalar_operand_seconds(device)`
    float_s, int_s = cal.scalar_operand_float_host_s, cal.scalar_operand_int_host_s
    return sum(r.count * (float_s if r.dtype.startswith(FLOATING_DTYPES) else int_s)
               for r in records if r.scalar_operand)


def warm_step_entry_seconds(layer: Layer, cal) -> float:
    """What a forward pays for starting after other code in a step whose ops all stay in
    the caches (`Layer.step_warm`): none after the same code (`same_code_before`); else
    the entry and cold ops at the kit's least work, a small layer's forward and backward
    alone before the layer (the after-backward `ColdEntryPoint` at the fewest ops: the
    others add a block's forward, which evicts more than such a step runs). Live, the
    profile's order less the same with the layer run once more just before (mlp-small,
    micro-batch 1/4/16, five interleaved rounds each, load 6.5-8.5, 2026-11-25): the
    first block 4.4/6.6/5.9 us, the head 4.1/4.9/5.4, blocks.2 (same code) 0.6/0.4/1.0;
    the kit's point read 3.4 + 2 x 1.6. Kits without points: none, as they priced. After a
    backward the same code before counts for nothing (a stage's first forward after one)."""
    if layer.same_code_before and not layer.forward_after_backward:
        return 0.0
    points = [p for p in cal.cold_entry_points if p.after_backward]
    if not points:
        return 0.0
    least = min(points, key=lambda p: p.after_ops)
    return least.entry_s + layer.cold_distinct_ops_fwd * least.op_s


def cold_entry_seconds(layer: Layer, cal) -> float:
    """What a forward pays for starting after a step's other work: an entry + its cold
    ops x a slope, read off the kit's `ColdEntryPoint`s (`cost_models.cold_entry_probes
    .cold_entry_calibration`) of its kind (after a backward or not,
    `forward_after_backward`) on the line between the two whose ops after bracket the
    layer's (`after_ops`; flat beyond the ends): how much of a layer's code and objects
    the work between evicts grows with that work (the probe's layer norm over its warm
    run, a block's forward before: 8 us with nothing after, 10 after one Linear's 19 ops'
    forward and backward, 13 after 67, 15 after a block's 117; after a backward, 3 after
    17, 29 after 115: one thread, load 4-7, 2026-11-25). The
    layer before running the same ops (`same_code_before`, a table after a table: 1.4 us
    where a block before read 10): the same-code entry, on the points' line of it where
    they carry one (`ColdEntryPoint.same_code_entry_s`: it grows with the work between
    too, 0.60-0.78 us after a Linear's 17 ops, 1.69-2.07 after a block's 115, four
    interleaved rounds, load 0.6, 2026-11-26), else the kit's single figure. Kits without
    points: the single figures."""
    first = layer.forward_after_backward
    points = sorted((p for p in cal.cold_entry_points if p.after_backward == first),
                    key=lambda p: p.after_ops)
    if not points:  # a kit before the points
        entry_s = (cal.cold_entry_after_backward_host_s
                   if first and cal.cold_entry_after_backward_host_s > 0
                   else cal.cold_entry_host_s)
        return entry_s + layer.cold_distinct_ops_fwd * cal.cold_op_host_s
    same_points = [p for p in points if p.same_code_entry_s > 0]
    if layer.same_code_before and not first and same_points:
        same_s, = read_points(same_points, layer.after_ops, "same_code_entry_s")
        return same_s + layer.cold_distinct_ops_fwd * points[0].op_s
    if layer.same_code_before and not first and cal.cold_entry_same_code_host_s > 0:
        return cal.cold_entry_same_code_host_s + layer.cold_distinct_ops_fwd * points[0].op_s
    entry_s, op_s = read_points(points, layer.after_ops, "entry_s", "op_s")
    return entry_s + layer.cold_distinct_ops_fwd * op_s


def read_points(points, after_ops: int, *fields: str) -> tuple[float, ...]:
    """`fields` of `points` (probed after work of `after_ops` ops each, sorted by them) on
    the line between the two that bracket `after_ops`, flat beyond the ends: the work
    between evicts more of a layer's code the more it is (`cold_entry_seconds`)."""
    ops = min(max(after_ops, points[0].after_ops), points[-1].after_ops)
    low = max((p for p in points if p.after_ops <= ops), key=lambda p: p.after_ops)
    high = min((p for p in points if p.after_ops >= ops), key=lambda p: p.after_ops)
    share = ((ops - low.after_ops) / (high.after_ops - low.after_ops)
             if high.after_ops > low.after_ops else 0.0)
    return tuple(getattr(low, f) + share * (getattr(high, f) - getattr(low, f)) for f in fields)


def host_position_key(layer: Layer, cluster: ClusterSpec) -> tuple:
    """What of a layer's place its time on `cluster` reads (`Layer.host_position`: its cold
    ops, each pass only where the kit prices it; profile-device prices both; the ops the
    work before ran, `Layer.recent_ops_fwd` / `_bwd`, where it prices cold kernels), ()
    where the cluster prices no cold op (GPU presets, older kits): a search shares one
    priced table among the layers equal in structure and in this."""
    cal = cluster.kernel_calibration
    if cal is None:
        return ()
    forward, backward = layer.host_position
    points = bool(cal.cold_entry_points)  # cold_entry_seconds reads them, whatever the figures
    # the first layer's entry is its own (its own figure, or its own points)
    first_apart = cal.cold_entry_after_backward_host_s > 0 or points
    if first_apart:
        forward = (forward, layer.forward_after_backward)
    if points:
        forward = (forward, layer.after_ops, layer.same_code_before)
    forward_priced = cal.cold_op_host_s > 0 or first_apart
    # the two backward counts, each where its figure prices it
    backward = (layer.cold_distinct_ops_bwd if cal.cold_backward_op_host_s > 0 else None,
                layer.cold_inner_ops_bwd if cal.cold_backward_inner_op_host_s > 0 else None)
    backward_priced = backward != (None, None)
    if cal.cold_backward_points:  # backward_host_seconds reads them, whatever the figures
        backward = (layer.cold_distinct_ops_bwd, layer.cold_inner_ops_bwd,
                    layer.backward_after_ops)
        backward_priced = True
    key = ((forward if forward_priced else None, backward if backward_priced else None)
           if forward_priced or backward_priced else ())
    # the ops the work just before ran, where the kit prices their cold kernel code
    # (`cold_kernel.recent_code_credit_seconds`)
    if cal.cold_kernels and (layer.recent_ops_fwd or layer.recent_ops_bwd):
        return key, layer.recent_ops_fwd, layer.recent_ops_bwd
    return key


@per_layer
def backward_host_seconds(layer: Layer, cluster: ClusterSpec) -> float:
    """Host seconds of one backward's dispatch. Where the device kit measured it in parts
    (`KernelCalibration.backward_view_host_op_s`, `backward_nonview_host_op_s`,
    `backward_node_host_s`, `host_op_excess`) and the layer has kernel records: views x
    per-view + other ops x per-op + autograd nodes x per-node + each op's per-call
    excess + each call given a number the formula wraps (`wrapped_number_host_seconds`:
    RsqrtBackward0's `mul.Scalar(-0.5)`, MeanBackward's `div.Scalar(n)`, at the forward's
    figures: from C++ they read the same, tests/test_scalar_operands.py), where nodes =
    the autograd graph's, walked on meta (`autograd_nodes_bwd`,
    `ir.op_count.autograd_nodes`: the count the kit's probe takes of its own chain), or
    for a layer measured before that count the forward's calls on floating tensors +
    its parameter tensors (`host_excess.backward_nodes`), + the distinct ops the layers
    after's backwards did not run x `cold_backward_op_host_s` (`cold_distinct_ops_bwd`) +
    the ops composites run inside that they did not x `cold_backward_inner_op_host_s`
    (`cold_inner_ops_bwd`), both figures read off the kit's `ColdBackwardPoint`s at the
    window's work (`Layer.backward_after_ops`, `read_points`) where it has them, none
    where a whole step's ops stay in the caches (`Layer.step_warm`);
    else ops x `host_op_seconds`. (Views are metadata only, and many come inside
    a node's formula, so a per-op figure over-prices them: the mlp-small block's 16
    backward ops ran in ~18 us, not 16 x 2 us. An allocation is recorded as a view but
    dispatched as an op: `KernelRecord.host_view`.)"""
    cal = cluster.kernel_calibration
    if cal is None or cal.backward_nonview_host_op_s <= 0 or layer.kernels is None:
        return layer.ops_bwd * host_op_seconds(cluster, backward=True)
    views = sum(r.count for r in layer.kernels.backward if r.host_view)
    nodes = layer.autograd_nodes_bwd or backward_nodes(  # walked, else the proxy
        layer.kernels.forward, layer.param_tensors)
    # Measured decomposition (cost_models.host_probes.host_op_seconds_by_pass, host_excess)
    host_s = (views * cal.backward_view_host_op_s
              + (layer.ops_bwd - views) * cal.backward_nonview_host_op_s
              + nodes * cal.backward_node_host_s
              + records_excess_seconds(layer.kernels.backward, cal.host_excess_s)
              + wrapped_number_host_seconds(layer.kernels.backward, cal))
    # + cold ops (cost_models.cold_backward_probes.cold_backward_cost), none where a whole
    # step stays in the caches (ir.op_count.step_evicts). Each count at its own figure:
    # the fit may read either as 0 on a loaded host, a 0 price and not a switch.
    if layer.step_warm:
        return host_s
    op_s, inner_op_s = cal.cold_backward_op_host_s, cal.cold_backward_inner_op_host_s
    if cal.cold_backward_points:  # by the work between (cold_backward_calibration's points)
        op_s, inner_op_s = read_points(sorted(cal.cold_backward_points,
                                              key=lambda p: p.after_ops),
                                       layer.backward_after_ops, "op_s", "inner_op_s")
    return (host_s + layer.cold_distinct_ops_bwd * op_s
            + layer.cold_inner_ops_bwd * inner_op_s)
