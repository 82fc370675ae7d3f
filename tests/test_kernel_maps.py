"""Reading the probes' maps in batches: every array slot once, in order, whatever the batch size;
every entry of a hash map once, whatever its buffer."""

from __future__ import annotations

import pytest

from gpuguard.sources.ebpf.kernel_maps import lookup_batch, occupied_items
from tests.support.kernel_maps import array_items

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

PROGRAM = """
struct leaf { u64 owner; u32 small; u8 pad[12]; };
BPF_ARRAY(slots, struct leaf, 1000);
BPF_HASH(pending, u32, struct leaf, 4096);
"""


@pytest.fixture(scope="module")
def bpf():
    from bcc import BPF

    bpf = BPF(text=PROGRAM.encode())
    try:
        yield bpf
    finally:
        bpf.cleanup()


@pytest.fixture
def table(bpf):
    return bpf[b"slots"]


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


@pytest.mark.parametrize(
    "entries, chunk", [(0, 64), (15, 64), (15, 1), (300, 1), (300, 64), (4096, 7)]
)
def test_a_hash_maps_entries_are_each_read_once_whatever_the_first_buffer(bpf, entries, chunk):
    """The exec filter's pending walk: a first buffer smaller than the entries (it grows), and
    one smaller than a bucket (ENOSPC: it grows), lose and repeat nothing."""
    table = bpf[b"pending"]
    table.clear()
    for tgid in range(1, entries + 1):
        leaf = table.Leaf()
        leaf.owner, leaf.small = tgid * 1000, tgid % 97
        table[table.Key(tgid)] = leaf
    keys, leaves, n = lookup_batch(table, 0, room=chunk)
    pairs = [(keys[i], leaves[i]) for i in range(n)]
    assert sorted(key for key, _ in pairs) == list(range(1, entries + 1))
    assert all((leaf.owner, leaf.small) == (key * 1000, key % 97) for key, leaf in pairs)
