"""Process facts read from /proc: identity, CPU, memory, open GPU files, containers, configs.

Part of ``gpuguard.sources``: may import errors, escape, events and sources.
"""
