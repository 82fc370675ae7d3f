"""Host checks: findings about the host rather than one process, and their rule rows.

Part of ``gpuguard.detect``: may import errors, escape, events, sources, correlate and detect.
"""
