"""Network facts: open connections, TCP counters, payload reassembly, session windows.

Part of ``gpuguard.sources``: may import errors, escape, events and sources.
"""
