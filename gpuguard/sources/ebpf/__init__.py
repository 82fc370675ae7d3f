"""The eBPF sensor's user-space half: probe text, loading, decoding and the probes' maps.

Part of ``gpuguard.sources``: may import errors, escape, events and sources.
"""
