"""Train a Hugging Face model with one call: `auto_parallel` traces, plans and shards it.

The model is built the way a user builds one — `AutoModelForCausalLM.from_config` on
any transformers config (random init, nothing downloaded) — and trained with the
user's own loss function. No plan is given: rank 0 searches one and broadcasts it.

One process:
    python examples/train_hf.py
Four CPU processes (gloo); on a GPU box the same line runs NCCL on 4 GPUs:
    torchrun --nproc-per-node 4 examples/train_hf.py
    torchrun --nproc-per-node 4 examples/train_hf.py --config tests/data/hf/qwen2/config.json
With a plan written beforehand by `planner plan hf:CONFIG --global-batch 8 --seq-len 32
--out p.json` (the plan pins the shape it was made for):
    torchrun --nproc-per-node 2 examples/train_hf.py --plan p.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner import auto_parallel  # noqa: E402

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "tests", "data", "hf", "llama", "config.json")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="a transformers config.json")
    p.add_argument("--plan", default=None, help="a plan JSON from `planner plan hf:CONFIG`")
    p.add_argument("--global-batch", type=int, default=8, help="samples per optimizer step")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-3)
    return p.parse_args()


def build_model(config_path: str) -> torch.nn.Module:
    """What a user writes: a causal LM from a config, with the library's defaults."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(config_path) as f:
        fields = json.load(f)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)  # every rank builds the same weights
    return AutoModelForCausalLM.from_config(config)


def next_token_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """The user's loss: logits (B, T, V) against the input shifted by one."""
    logits = output.logits if hasattr(output, "logits") else output
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                           labels[:, 1:].reshape(-1))


def main() -> None:
    args = parse_args()
    model = build_model(args.config)
    vocab = model.config.vocab_size
    rows = torch.Generator().manual_seed(1)

    def batch() -> tuple[dict, torch.Tensor]:
        ids = torch.randint(0, vocab, (args.global_batch, args.seq_len), generator=rows)
        return {"input_ids": ids}, ids

    inputs, labels = batch()
    micro = {"input_ids": inputs["input_ids"][:1]}  # the shape the model IR is measured at
    pm = auto_parallel(model, (micro, labels[:1]), loss_fn=next_token_loss,
                       optimizer=torch.optim.AdamW, optimizer_kwargs={"lr": args.lr},
                       global_batch=args.global_batch, plan=args.plan)
    rank = dist.get_rank()
    if rank == 0:
        print(f"plan: {pm.plan}")
    for step in range(args.steps):
        loss = pm.train_step(batch())
        if rank == 0:
            print(f"step {step}: loss {loss:.4f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
