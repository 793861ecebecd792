"""Per-phase seconds of a hybrid (sharded-table) step, measured inside one rank by
`planner validate` (planner/trial/rank.py) for plans with sharded tables.

On a loaded shared machine a 4-process run's step time moves by more than the 25%
target between runs; the SHAPE of a step (what share goes to lookups, exchanges, the
dense layers, the optimizers) moves far less. `PhaseClock` wraps the executor's own
entry points for the timed steps and sums wall seconds per phase:

  forward            the model's forward (root module pre-hook to hook)
  lookup             executors.table_exchange.lookup_tables: routing, the forward
                     all-to-alls and the pooling (a forward pre-hook of the model with
                     `table_inputs`: before `forward` starts)
  a2a_forward        all_to_all_single calls inside the forward (header, ids, pooled)
  table_backward     _FusedLookup.backward: the gradient all-to-all + the sparse gradients
  a2a_backward       all_to_all_single calls inside the backward
  a2a_optimizer      all_to_all_single calls inside the sparse step (column-wise tables'
                     row-wise Adagrad sums)
  forward_backward   ParallelModel._forward_backward: forward, loss and backward
  replicated_gathers executors.hybrid_step.all_gather_sparse (replicated tables)
  dense_comm         every other collective call (FSDP / DDP gradient sync, the loss sum):
                     the call's own time (an async call's launch only)
  dense_step         the dense optimizer's step
  sparse_step        the tables' row-sparse optimizer step

and derives dense_forward = forward - lookup and dense_backward = forward_backward -
forward - table_backward - the dense collectives issued inside backward. `per_step`
divides by the timed steps and names each phase `<phase>_s`; it adds `a2a_calls` and the
bytes the rank's all_to_all_single calls sent and received (`a2a_sent_bytes`,
`a2a_received_bytes`: what cost_models.embedding prices), and for the dense collectives
`dense_calls` (with `dense_calls_<name>` per collective), `dense_bytes` (their first
tensor's bytes: what cost_models.comm prices) and `dense_comm_cpu_s` (process CPU seconds
inside them: gloo's copies and reductions, against the call's wall seconds). The
wrappers are removed on exit.

`arrival_wait` joins every rank's `call_log` (planner.trial.rank gathers them): each
collective's seconds split into waiting for the last rank to arrive (`<phase>_wait_s`: on
CPU processes sharing cores, the peers' busy time) and the call after it
(`<phase>_after_arrival_s`: what an alpha-beta fit prices).
"""

from __future__ import annotations

import time

import torch.distributed as dist

# Collectives wrapped as "dense_comm" when they exist in this torch (FSDP2's single-tensor
# forms included); all_to_all_single is the tables' and is timed apart.
DENSE_COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor",
                     "all_gather_single", "reduce_scatter_single", "broadcast",
                     "reduce_scatter", "all_gather")


class PhaseClock:
    """`with PhaseClock(pm) as clock: ...steps...`; then `clock.per_step(steps)`."""

    def __init__(self, pm):
        self.pm = pm
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.a2a_bytes = [0, 0]  # sent, received by this rank's all_to_all_single calls
        self._where = "outside"  # "forward", "backward" or "outside" the forward/backward
        self._nested = 0  # inside a wrapped table phase: its collectives are its own
        self._inside: list[str] = []  # the wrapped table phases running now, innermost last
        self._undo: list = []
        self.dense_calls: dict[str, int] = {}  # dense collective name -> calls
        self.dense_bytes = 0  # bytes of the dense collectives' first tensor argument
        # (phase, enter, exit) wall-clock (time.time: one clock for every process on the
        # host) of each collective, in call order: `arrival_wait` compares the ranks'
        self.call_log: list[tuple[str, float, float]] = []

    def _add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
        self.calls[phase] = self.calls.get(phase, 0) + 1

    def _patch(self, owner, name: str, make) -> None:
        own = vars(owner)  # what the owner itself holds (a staticmethod stays one)
        self._undo.append((owner, name, name in own, own.get(name)))
        setattr(owner, name, make(getattr(owner, name)))

    def _timed(self, phase: str, nested: bool = False, then: str | None = None):
        """Wrap a callable: its seconds go to `phase`; `then`: where the step is after it."""
        def make(original):
            def wrapper(*args, **kwargs):
                inside_forward = self._where == "forward"
                start = time.perf_counter()
                if nested:
                    self._nested += 1
                    self._inside.append(phase)
                try:
                    return original(*args, **kwargs)
                finally:
                    if nested:
                        self._nested -= 1
                        self._inside.pop()
                    elapsed = time.perf_counter() - start
                    self._add(phase, elapsed)
                    if inside_forward:
                        self._add(phase + "_in_forward", elapsed)
                    if then is not None:
                        self._where = then
            return wrapper
        return make

    def _a2a(self, original):
        def wrapper(output, input, *args, **kwargs):
            self.a2a_bytes[0] += input.numel() * input.element_size()
            self.a2a_bytes[1] += output.numel() * output.element_size()
            enter_s = time.time()
            start = time.perf_counter()
            try:
                return original(output, input, *args, **kwargs)
            finally:
                if self._inside[-1:] == ["sparse_step"]:
                    side = "a2a_optimizer"
                else:
                    side = "a2a_backward" if self._where == "backward" else "a2a_forward"
                elapsed = time.perf_counter() - start
                self._add(side, elapsed)
                self.call_log.append((side, enter_s, enter_s + elapsed))
        return wrapper

    def _dense(self, original):
        name = original.__name__

        def wrapper(*args, **kwargs):
            if self._nested:
                return original(*args, **kwargs)
            tensor = args[0] if args else None
            nbytes = tensor.numel() * tensor.element_size() if hasattr(tensor, "numel") else 0
            enter_s, cpu_s = time.time(), time.process_time()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self._add("dense_comm", elapsed)
                self._add("dense_comm_cpu", time.process_time() - cpu_s)
                self.dense_calls[name] = self.dense_calls.get(name, 0) + 1
                self.dense_bytes += nbytes
                self.call_log.append(("dense_comm", enter_s, enter_s + elapsed))
                if self._where == "backward":
                    self._add("dense_comm_in_backward", elapsed)
        return wrapper

    def __enter__(self) -> PhaseClock:
        import executors.runtime as runtime
        import executors.sharded_embedding as sharded
        from executors.table_exchange import _FusedLookup

        pm = self.pm
        self._patch(dist, "all_to_all_single", self._a2a)
        for name in DENSE_COLLECTIVES:
            if hasattr(dist, name):
                self._patch(dist, name, self._dense)
        self._patch(sharded, "lookup_tables", self._timed("lookup", nested=True))
        self._patch(runtime, "all_gather_sparse", self._timed("replicated_gathers", nested=True))
        self._patch(_FusedLookup, "backward", lambda f: staticmethod(
            self._timed("table_backward", nested=True)(f)))
        self._patch(pm, "_forward_backward", self._timed("forward_backward", then="outside"))
        self._patch(pm.optimizer, "step", self._timed("dense_step"))
        if pm.sparse_optimizer is not None:
            self._patch(pm.sparse_optimizer, "step", self._timed("sparse_step", nested=True))
        module = pm.module
        starts: list[float] = []

        def pre(*_):
            self._where = "forward"
            starts.append(time.perf_counter())

        def post(*_):
            self._add("forward", time.perf_counter() - starts.pop())
            self._where = "backward"  # loss, backward, gradient sync: until _forward_backward ends

        self._hooks = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        for owner, name, had_own, original in reversed(self._undo):
            if had_own:
                setattr(owner, name, original)
            else:  # an instance attribute over its class's method
                delattr(owner, name)

    def step_done(self) -> None:
        self._where = "outside"

    def per_step(self, steps: int) -> dict[str, float]:
        """Seconds per step of every phase (`<phase>_s`), with the derived dense forward
        and backward; the all-to-all calls and bytes per step."""
        s = {k: v / steps for k, v in self.seconds.items()}
        g = s.get
        s["lookup_host"] = g("lookup", 0.0) - g("a2a_forward", 0.0)
        # the fused lookup runs in a forward pre-hook of the model (before this clock's
        # own) when the model has `table_inputs`, else inside each table's forward
        s["dense_forward"] = g("forward", 0.0) - g("lookup_in_forward", 0.0)
        s["dense_backward"] = (g("forward_backward", 0.0) - g("forward", 0.0)
                               - (g("lookup", 0.0) - g("lookup_in_forward", 0.0))
                               - g("table_backward", 0.0) - g("dense_comm_in_backward", 0.0))
        out = {f"{k}_s": v for k, v in s.items()}
        out["a2a_calls"] = sum(self.calls.get(k, 0) for k in
                               ("a2a_forward", "a2a_backward", "a2a_optimizer")) / steps
        out["a2a_sent_bytes"] = self.a2a_bytes[0] / steps
        out["a2a_received_bytes"] = self.a2a_bytes[1] / steps
        out["dense_calls"] = sum(self.dense_calls.values()) / steps
        for name, calls in self.dense_calls.items():
            out[f"dense_calls_{name}"] = calls / steps
        out["dense_bytes"] = self.dense_bytes / steps
        return out


def arrival_wait(logs: list[list[tuple[str, float, float]]], rank: int, steps: int) -> dict:
    """Split rank `rank`'s seconds in each kind of collective (`PhaseClock.call_log`: the
    same calls in the same order on every rank) into waiting for the last rank to arrive
    and the collective after it: call k waits max_r enter_r - enter_rank, then runs
    exit_rank - max(max_r enter_r, enter_rank). `<phase>_wait_s` and
    `<phase>_after_arrival_s`, seconds per step; {} when the ranks' logs differ."""
    if len({tuple(c[0] for c in log) for log in logs}) != 1:
        return {}
    out: dict[str, float] = {}
    for k, (phase, enter, leave) in enumerate(logs[rank]):
        last = max(log[k][1] for log in logs)
        out[f"{phase}_wait_s"] = out.get(f"{phase}_wait_s", 0.0) + max(last - enter, 0.0) / steps
        out[f"{phase}_after_arrival_s"] = (out.get(f"{phase}_after_arrival_s", 0.0)
                                           + max(leave - max(last, enter), 0.0) / steps)
    return out
