"""YARA: compile rule files, scan executables, command lines and memory.

Part of ``gpuguard.detect``: may import errors, escape, events, sources, correlate and detect.
"""
