"""Trial runs: a plan run for real on this machine against what it predicted
(`planner validate`; `executors.validate` is another thing: it checks a plan is legal).

    result = validate_plan("plan.json", nproc=4, steps=5)     # planner.trial.run
    result.to_json()   # {"ranks": [...], "predicted_iteration_seconds": ..., ...}

`nproc` ranks are started (forks of the preloaded server, `ir.launch`; one free localhost
port; gloo on CPU, NCCL when every rank gets a GPU). Every rank builds the plan's model
from the same seed, applies the plan with `executors.apply` and trains on the same
global batches:

  1. memory: the model is built and sharded inside a `LiveTensorTracker` (CPU: DTensors
     count by their local shard, FSDP2's storage resizes are followed; on GPUs the CUDA
     allocator's peak), one warm-up step runs (optimizer states appear), the peak is
     reset and MEMORY_STEPS steps are measured;
  2. time: outside the tracker (it adds a Python call per ATen op), TIME_WARMUP_STEPS
     more steps, then `steps` timed ones; a step ends when the slowest rank ends, the
     figure is the median over steps; each rank's wait for a core in each step is read
     too (`sched`), so the step without other processes' load is known beside it;
  3. correctness: every step's global mean loss against a single-process run of the
     same model on the same batches (relative `reference.loss_rtol`); the first step's
     gradient norms, per layer, against one process under the plan's own precision
     policy (`grad_check`: no loss bound sees a gradient 1% off; fp16 plans: losses only).

Dropout: a model with dropout draws different masks under a plan than in one process,
so when it has any, the measured run keeps it (the IR counts its masks) and a second,
short run with dropout 0 checks the losses.

The modules, in the order a run uses them:
  predict.py    the prediction per rank: the plan file's `predicted` block, or a fresh
                `cost_models.estimate` on a given cluster; how far the machine drifted
  reference.py  what both sides train with (seeds, batches, optimizer settings) and the
                single-process losses and first-step gradient norms
  mixed_reference.py  a bf16 plan's reference: one process under the plan's policy
  grad_check.py the gradient norms every rank records, and the verdict
  records.py    typed payloads and results: what a rank is given, what it measures
  rank.py       one rank's loop (and the same measurement in this process)
  sched.py      the scheduler's reading of a thread: CPU and waiting for a core
  spawn.py      starting the ranks; none outlives the run
  run.py        `validate_plan`: the whole loop
  calibrate.py  the spec refitted to the measured time
"""
