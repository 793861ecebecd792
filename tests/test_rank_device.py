"""`executors.apply` resolves the device it is given once (`rank_device`): torch 2.11's
`torch.cuda.set_device` refuses a GPU named without an index, so every
`apply(..., device="cuda")` of the GPU smoke (bench/bench_gpu_smoke.py) failed on an H100
(2026-11-25) while validate's ranks, which pass cuda:LOCAL_RANK, ran."""

import torch

from executors.apply import rank_device


def test_an_index_less_gpu_is_this_ranks(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert rank_device("cuda") == torch.device("cuda", 3)
    assert rank_device(torch.device("cuda")) == torch.device("cuda", 3)
    assert rank_device("cuda:1") == torch.device("cuda", 1)  # an explicit index stays
    assert rank_device("cpu") == torch.device("cpu")


def test_none_is_the_default_device():
    assert rank_device(None) == torch.device("cpu")  # no NCCL group here
