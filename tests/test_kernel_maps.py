"""Reading the probes' array maps in batches: every slot once, in order, whatever the batch size."""

from __future__ import annotations

import pytest

from gpuguard.sources.ebpf.kernel_maps import occupied_items
from tests.support.kernel_maps import array_items

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

PROGRAM = """
struct leaf { u64 owner; u32 small; u8 pad[12]; };
BPF_ARRAY(slots, struct leaf, 1000);
"""


@pytest.fixture(scope="module")
def table():
    from bcc import BPF

    bpf = BPF(text=PROGRAM.encode())
    try:
        yield bpf[b"slots"]
    finally:
        bpf.cleanup()


@pytest.mark.parametrize("batch", [0, 1, 7, 999, 1000, 5000])
def test_every_slot_is_read_once_in_order(table, batch):
    for index in range(0, 1000, 3):
        leaf = table.Leaf()
        leaf.owner, leaf.small = (index << 32) | 77, index * 2
        table[table.Key(index)] = leaf
    pairs = array_items(table, batch=batch)
    assert [int(k) for k, _ in pairs] == list(range(1000))
    for key, leaf in pairs:
        expected = ((key << 32) | 77, key * 2) if key % 3 == 0 else (0, 0)
        assert (leaf.owner, leaf.small) == expected


@pytest.mark.parametrize("batch", [0, 7, 1000])
def test_only_the_slots_in_use_are_returned_whole(table, batch):
    """A slot is in use when its leading u64 is not zero, whatever the rest holds."""
    for index in range(1000):
        table[table.Key(index)] = table.Leaf()
    for index in (0, 5, 998, 999):
        leaf = table.Leaf()
        leaf.owner, leaf.small = (index << 32) | 1, index
        table[table.Key(index)] = leaf
    stale = table.Leaf()
    stale.small = 77  # a freed slot with a leftover field: not in use
    table[table.Key(500)] = stale
    pairs = occupied_items(table, batch=batch)
    assert [int(k) for k, _ in pairs] == [0, 5, 998, 999]
    assert [(leaf.owner, leaf.small) for _, leaf in pairs] == [
        ((i << 32) | 1, i) for i in (0, 5, 998, 999)
    ]
