"""Memory, compute, communication and pipeline cost models."""
