"""The rules file: read with positions, merge layers, compile conditions, the allowlist, reload.

Part of ``gpuguard.detect``: may import errors, escape, events, sources, correlate and detect.
"""
