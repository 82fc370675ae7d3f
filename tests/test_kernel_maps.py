"""Reading the probes' array maps in batches: every slot once, in order, whatever the batch size."""

from __future__ import annotations

import pytest

from gpuguard.sources.ebpf.kernel_maps import array_items

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
