"""GPU samplers: NVIDIA (NVML), AMD (amdsmi), any DRM driver (fdinfo), and replay of recorded samples.

Part of ``gpuguard.sources``: may import errors, escape, events and sources.
"""
