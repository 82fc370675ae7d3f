"""Host-wide facts: the GPU stack, persistence places, one look at the live host.

Part of ``gpuguard.sources``: may import errors, escape, events and sources.
"""
