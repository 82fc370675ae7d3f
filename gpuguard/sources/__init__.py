"""Sources: where facts come from: the eBPF sensor, GPU samplers, /proc, host files, recordings.

Owns every read of the outside world that produces events or facts: the
probe loader and ring-buffer decoding (``sensor``, ``bpf_decode``), process
facts and config files read inside a process's own root (``process``,
``config_files``, ``proc_files``), GPU holders and samplers (``fd_holders``,
``gpu/``), host observations for ``scan`` (``host_observation``,
``persistence``, ``host_gpu_stack``, ``hidden_pids``), and the on-disk YARA
result cache (``yara_verdict_cache``, plain data).

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events`` and
itself; never correlate, detect, respond, outputs or commands (tests/test_layers.py).
"""
