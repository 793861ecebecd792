"""`dist_utils.spawn` says where a rank that died of a signal was: the Python stacks of
its threads, which faulthandler writes (one CI run's 4-rank group lost a rank to a
SIGSEGV that only its exit code told of)."""

from __future__ import annotations

import pytest
from torch.multiprocessing import ProcessExitedException

from tests.dist_utils import spawn


def _segfaulting_worker(rank: int, world_size: int, payload) -> None:
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV


def test_a_rank_killed_by_a_signal_fails_spawn_with_its_stack():
    with pytest.raises(ProcessExitedException) as caught:
        spawn(_segfaulting_worker, 1, timeout_s=120)
    message = str(caught.value)
    assert "SIGSEGV" in message
    assert "Fatal Python error: Segmentation fault" in message
    assert "_segfaulting_worker" in message  # the rank's own frame
