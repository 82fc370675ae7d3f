"""Rule signals: the named values rule conditions test, how they are read and rescored.

Part of ``gpuguard.detect``: may import errors, escape, events, sources, correlate and detect.
"""
