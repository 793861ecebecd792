"""Which outputs of a layer's ops are shaped like its parameters: weight gradients, whose
bytes do not grow with the micro-batch (`ir.kernel_recorder` counts their bytes with the
weights' and marks a record whose first output is one, `KernelRecord.weight_output`, so
`cost_models` scales them by the dtype only).

    >>> import torch
    >>> g = torch.empty(1, 8, device="meta")
    >>> is_weight_gradient("sum", g, frozenset({(8,)}))
    True
"""

from __future__ import annotations

import torch

# Backward ops that write an embedding table's dense gradient (rows x dim): its bytes are
# the table's, not the batch's (aten's embedding and embedding_bag backward kernels).
EMBEDDING_GRADIENT_OPS = frozenset({"embedding_dense_backward", "_embedding_bag_backward",
                                    "_embedding_bag_dense_backward"})


def is_weight_gradient(name: str, t: torch.Tensor, weight_shapes: frozenset) -> bool:
    """A backward output that does not grow with the micro-batch: an embedding's dense
    gradient, a norm's 1-D weight gradients, or a bias gradient (a `sum` over the
    tokens, kept as (1, out)). Only 1-D matches otherwise: an activation is at least
    2-D, so it does not pass for a bias by coincidence."""
    shape = tuple(t.shape)
    if name in EMBEDDING_GRADIENT_OPS:
        return shape in weight_shapes
    if name == "sum":
        while len(shape) > 1 and shape[0] == 1:
            shape = shape[1:]
    return len(shape) == 1 and shape in weight_shapes


def is_weight_output(name: str, out: torch.Tensor, reads_weight: bool, gemm: bool,
                     weight_shapes: frozenset) -> bool:
    """Whether an op's first output `out` is a weight gradient: `is_weight_gradient`'s, or,
    for a matmul (`gemm`), a 2-D product that reads no parameter (`reads_weight`) shaped
    like one: a Linear's x^T @ dy, where its grad_input dy @ W and its forward x @ W^T
    read W. Told apart by what the product reads, not by its dims: a weight gradient's
    m can equal the tokens (hidden 64 at 64 tokens), which no dim rule can tell."""
    if gemm:
        return out.dim() == 2 and tuple(out.shape) in weight_shapes and not reads_weight
    return is_weight_gradient(name, out, weight_shapes)
