"""The model IR: tracing, layers, strategies, plans and cluster specs (plain data)."""
