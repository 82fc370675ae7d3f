"""Recordings packed by hand from the documented format (docs), without gpuguard's writer."""

from __future__ import annotations

import zlib

import msgpack

from gpuguard.events import abi

T0 = 1_718_000_000.25  # the recordings' clock


def raw_recording(records: list, header: dict | None = None, end: bool = True) -> bytes:
    """A recording packed by hand from the documented format."""
    header = (
        header
        if header is not None
        else {
            "format": "gpuguard-recording",
            "version": 1,
            "abi": abi.ABI_VERSION,
            "created": T0,
            "host": "h",
            "gpuguard": "test",
            "meta": {},
        }
    )
    packer = msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape")
    body = b"".join(packer.pack(r) for r in [header, *records])
    if end:
        body += msgpack.packb(
            {"kind": "recording_end", "items": len(records), "crc32": zlib.crc32(body)}
        )
    return body
