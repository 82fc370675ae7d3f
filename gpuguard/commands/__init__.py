"""One module per CLI command; each only wires the stages together (no detection logic).

May import every layer (errors, escape, events, sources, correlate, detect,
respond, outputs); nothing but ``gpuguard.cli`` imports it (tests/test_layers.py).
"""
