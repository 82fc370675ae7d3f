"""GPU samplers: NVIDIA (NVML), AMD (amdsmi) and any DRM driver (fdinfo)."""
