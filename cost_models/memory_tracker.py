"""The live-tensor tracker, defined in `ir.memory_tracker` (the IR measures checkpointed
layers with it); kept importable here for the trial runs and tests that read it."""

from ir.memory_tracker import LiveStorage, LiveTensorTracker  # noqa: F401
