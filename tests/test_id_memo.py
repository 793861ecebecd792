"""The one id-keyed memo (`cost_models.id_memo.IdMemo`) and the caches built on it.

The memo answers by key, keeps what its keys name alive (so an id is not reused while
its entry stands: a new object is never answered with a dead one's value), keeps answers
that are None, and starts again past its size. `kernel_time.layer_kernel_seconds` is
checked against the sums it keeps, per records, cluster, step shape and share;
tests/test_layer_memo.py checks the GEMM rates, kernel kinds and per-layer memos.
"""

from __future__ import annotations

from cost_models.id_memo import IdMemo


class Box:
    """A stand-in for a frozen object, equal to nothing but itself."""

    def __init__(self, value: int):
        self.value = value


def test_answers_are_kept_by_key_and_made_once():
    calls = []

    def make(box, scale):
        calls.append((box.value, scale))
        return None if scale == 0 else box.value * scale  # None is an answer too

    memo = IdMemo(max_entries=8)
    a, b = Box(2), Box(3)
    for _ in range(2):
        assert memo.get((id(a), 5), a, make, a, 5) == 10
        assert memo.get((id(b), 5), b, make, b, 5) == 15
        assert memo.get((id(a), 0), a, make, a, 0) is None
    assert calls == [(2, 5), (3, 5), (2, 0)] and len(memo) == 3


def test_an_entry_keeps_its_object_so_its_id_is_not_reused():
    memo = IdMemo(max_entries=64)
    ids = set()
    for value in range(50):  # each box dropped at once: without the held reference
        box = Box(value)     # CPython hands the next box the same address
        ids.add(id(box))
        assert memo.get(id(box), box, lambda b: b.value, box) == value
        del box  # Box has no cycles: freed here by its count, no gc pass needed
    assert len(ids) == 50  # every box kept alive by the memo, so all ids differ


def test_past_its_size_the_memo_starts_again():
    memo = IdMemo(max_entries=3)
    boxes = [Box(i) for i in range(4)]
    for box in boxes:
        memo.get(id(box), box, lambda b: b.value, box)
    assert len(memo) == 1  # the fourth found three and cleared them
    calls = []
    assert memo.get(id(boxes[0]), boxes[0], lambda b: calls.append(b) or b.value,
                    boxes[0]) == 0 and calls == [boxes[0]]  # made again


def test_layer_kernel_seconds_are_the_sums_they_keep():
    from cost_models.kernel_time import layer_kernel_seconds, pass_seconds
    from ir.kernel_records import KernelRecords
    from ir.strategy import Checkpoint
    from tests.test_kernel_time import CALIBRATION, config, memory, spec

    kernels = (KernelRecords(forward=(memory("aten::add", 1 << 20),),
                             backward=(memory("aten::add", 1 << 20),) * 2),
               KernelRecords(forward=(memory("aten::mul", 4 << 20),), backward=()))
    clusters = (spec(CALIBRATION), spec(None))
    configs = (config(), config(micro_batch=2))
    for _ in range(2):  # the second round from the memo
        for records in kernels:
            for cluster in clusters:
                for cfg in configs:
                    for share in (1.0, 0.5):
                        got = layer_kernel_seconds(records, cluster, cfg, share)
                        assert got.forward == pass_seconds(records.forward, cluster, cfg,
                                                           share, backward=False)
                        assert got.backward == pass_seconds(records.backward, cluster, cfg,
                                                            share, backward=True)
                        assert got.selective_recompute == pass_seconds(
                            records.recomputed(Checkpoint.SELECTIVE), cluster, cfg, share,
                            backward=False)
    assert layer_kernel_seconds(kernels[0], clusters[0], configs[0]) != \
        layer_kernel_seconds(kernels[0], clusters[0], configs[1])  # shapes told apart
