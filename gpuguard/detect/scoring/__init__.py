"""Scoring: the engine that turns matched rules into one verdict per process.

Part of ``gpuguard.detect``: may import errors, escape, events, sources, correlate and detect.
"""
