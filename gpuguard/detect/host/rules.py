"""The host rules, listed once: every ``host-*`` rule row (id, name, description, score, ATT&CK).

The rules are data; the checks in :mod:`.host_checks`, :mod:`.gpu_host_checks` and
:mod:`.tuning_host_checks` only decide *whether* one fires and with what evidence.  Adding a
host rule is one row below plus the check that fires it; nothing registers itself on import.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class HostRule:
    id: str
    name: str
    description: str
    score: int  # 0-100, same scale as the process verdicts (severity follows from it)
    category: tuple[str, ...]  # ECS event.category values
    techniques: tuple[tuple[str, str], ...]  # (ATT&CK id, name)


RESOURCE_HIJACKING = ("T1496", "Resource Hijacking")

HOST_RULES: dict[str, HostRule] = {
    rule.id: rule
    for rule in (
        HostRule(
            "host-persistence-miner",
            "Autostart entry launches a miner",
            "A systemd unit, cron table, shell profile or rc.local names a known miner, "
            "a mining-pool URL scheme or a pool domain, so a miner comes back after a reboot or kill.",
            85,
            ("configuration", "file"),
            (
                RESOURCE_HIJACKING,
                ("T1053.003", "Scheduled Task/Job: Cron"),
                ("T1543.002", "Create or Modify System Process: Systemd Service"),
                ("T1546.004", "Event Triggered Execution: Unix Shell Configuration Modification"),
            ),
        ),
        HostRule(
            "host-hidden-process",
            "Process hidden from /proc listings",
            "The kernel knows a process that a /proc directory listing does not show: "
            "a readdir hook (preload or kernel rootkit) is hiding it, as miners' droppers do.",
            95,
            ("process", "intrusion_detection"),
            (("T1014", "Rootkit"), ("T1564", "Hide Artifacts"), RESOURCE_HIJACKING),
        ),
        HostRule(
            "host-ld-so-preload",
            "System-wide preload library configured",
            "/etc/ld.so.preload loads a library into every dynamically linked program; "
            "preload rootkits use it to hide miner processes and files.",
            70,
            ("configuration", "library"),
            (("T1574.006", "Hijack Execution Flow: Dynamic Linker Hijacking"),),
        ),
        HostRule(
            "host-raw-memory-node-exposed",
            "Raw memory or PCI BAR node open to all users",
            "/dev/mem or a PCI BAR resource file is readable or writable by every user: "
            "any process can read or corrupt GPU and host memory directly.",
            70,
            ("configuration", "host"),
            (("T1068", "Exploitation for Privilege Escalation"),),
        ),
        HostRule(
            "host-gpu-node-world-writable",
            "GPU device node open to all users",
            "Every local user (and every container that maps the node) can open this GPU "
            "device and run work on it; the NVIDIA driver installs its nodes 0666 by default, "
            "so this is a hardening note on shared hosts.",
            20,
            ("configuration", "host"),
            (RESOURCE_HIJACKING,),
        ),
        HostRule(
            "host-kernel-forced-module",
            "Kernel module force-loaded or force-unloaded",
            "The kernel taint shows a module loaded or removed with force (version checks "
            "bypassed), a habit of kernel rootkit installers.",
            50,
            ("driver", "host"),
            (("T1547.006", "Boot or Logon Autostart Execution: Kernel Modules and Extensions"),),
        ),
        HostRule(
            "host-untrusted-kernel-module",
            "Unsigned or out-of-tree non-GPU kernel module",
            "A loaded module that is not a GPU driver taints the kernel as unsigned (E) or "
            "out-of-tree (O); kernel rootkits that hide miners load this way.",
            45,
            ("driver", "host"),
            (
                ("T1547.006", "Boot or Logon Autostart Execution: Kernel Modules and Extensions"),
                ("T1014", "Rootkit"),
            ),
        ),
        HostRule(
            "host-gpu-driver-mismatch",
            "NVML library and NVIDIA kernel module disagree",
            "The user-space NVML library reports a different driver version than the loaded "
            "kernel module: a swapped or shimmed libnvidia-ml can hide GPU processes.",
            40,
            ("driver", "host"),
            (("T1574", "Hijack Execution Flow"),),
        ),
        # GPU memory and past GPU users (gpu_host_checks)
        HostRule(
            "host-gpu-memory-orphaned",
            "GPU memory held by no live process",
            "A GPU's memory is in use but no running process accounts for it, or a zombie or "
            "vanished process still holds it: the memory is lost to every other user until the "
            "holder is reaped or the GPU is reset.",
            30,
            ("host", "process"),
            (RESOURCE_HIJACKING,),
        ),
        HostRule(
            "host-gpu-past-heavy-user",
            "Exited process used a GPU flat out",
            "NVML accounting remembers a process that already exited after keeping a GPU busy for "
            "a long time; a miner that runs at night and is gone by the audit looks like this.",
            20,
            ("host", "process"),
            (RESOURCE_HIJACKING,),
        ),
        # CPU-miner host tuning (tuning_host_checks)
        HostRule(
            "host-msr-writes-enabled",
            "MSR writes enabled (msr allow_writes=on)",
            "The msr module was loaded with allow_writes=on, so root processes may rewrite model-specific "
            "registers: RandomX miners do this (`modprobe msr allow_writes=on`) to switch off the hardware "
            "prefetchers for ~15 % more hashrate.",
            40,
            ("configuration", "host"),
            (RESOURCE_HIJACKING,),
        ),
        HostRule(
            "host-hugepages-reserved",
            "Huge pages reserved",
            "Huge pages are reserved on the host: RandomX miners reserve them for "
            "their 2 GiB dataset, but so do databases, DPDK, JVMs and VMs, so this is context for the "
            "process findings, never a verdict by itself.",
            10,
            ("configuration", "host"),
            (RESOURCE_HIJACKING,),
        ),
    )
}
