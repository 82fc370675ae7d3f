"""gpuguard: finds and stops GPU abuse and cryptominers on Linux hosts.

The package reads as the data flows: ``sources`` (eBPF sensor, GPU samplers,
/proc) -> ``events`` (typed model, wire format) -> ``correlate`` (per-process
state) -> ``detect`` (rules, YARA, scoring) -> ``outputs`` (terminal, SIEM JSON,
metrics).  ``cli`` and ``commands`` only wire these together.
"""

__version__ = "0.1.0"
