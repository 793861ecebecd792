"""Apply a parallel plan on torch.distributed.

    from executors import apply, init_distributed
    init_distributed()                                  # torchrun env, or one process
    pm = apply(model, plan, graph, loss_fn=loss_fn)     # every rank, same model and seed
    for inputs, target in global_batches:               # the GLOBAL batch on every rank
        loss = pm.train_step(inputs, target)

Modules, one idea each: `mesh` (degrees, DeviceMeshes), `layout` (activation layouts and
re-layouts), `tensor_parallel`, `fused` (fused projections' per-rank row order),
`tp_check` (the set-up self-check), `checkpointing`, `data_parallel`, `pipeline`, `tied`
(shared weights), `optimizer` (one optimizer), `zero1` (ZeRO-1's flat shards),
`optimizer_state` (optimizer state in checkpoints), `loss_scaling` (fp16's agreed
scale), `grad_clip` (clipping by the global gradient norm), `data` (per-rank batch
shards), `validate` (rejections), `runtime` (ParallelModel, train_step), `state` (full
parameters, both ways), `checkpoint` (DCP save / resume under any plan), `pretrained` /
`pretrained_export` (Hugging Face safetensors in and out, shard by shard), `meta_record`
/ `materialize` (a meta-device build, each rank materializing only its shards), `apply`
(the composition, in one documented order).
Sharded embedding tables (recommendation models): `sharded_embedding` (placements,
all-to-all lookups), `sparse_optimizer` (row-sparse updates), `hybrid_step` (tables
model parallel, the rest data parallel), `embedding_checkpoint` (resharding DCP saves).
"""

from executors.apply import apply, default_device, init_distributed
from executors.data import global_batch_indices, local_rows, shard_batch
from executors.layout import Layout
from executors.mesh import MeshAxis, ParallelDims
from executors.meta_record import meta_init
from executors.runtime import ParallelModel
from executors.state import full_state_dict, load_full_state_dict
from executors.validate import check_plan

__all__ = ["apply", "check_plan", "default_device", "init_distributed", "full_state_dict",
           "load_full_state_dict", "global_batch_indices", "local_rows", "meta_init",
           "shard_batch", "Layout", "MeshAxis",
           "ParallelDims", "ParallelModel"]
