"""Sources: where facts come from (eBPF sensor, GPU samplers, /proc, recordings)."""
