"""Automatic parallelism planner for PyTorch."""
