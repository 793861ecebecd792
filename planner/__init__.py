"""Automatic parallelism planner for PyTorch.

    from planner import auto_parallel     # trace, plan, shard, train (planner/api.py)
"""


def __getattr__(name: str):
    # Lazy, so that the CLI does not import torch.distributed's executors it never uses.
    if name in ("auto_parallel", "AutoParallel"):
        from planner import api

        return getattr(api, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
