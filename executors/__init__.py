"""Apply a parallel plan on torch.distributed."""
