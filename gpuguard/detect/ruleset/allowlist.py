"""Allowlist: processes exempt from verdicts (kept clean, evidence still recorded for audit).

An entry matches when every field it names matches: executable path (glob)
and optionally its sha256, user, cgroup (glob), container id, parent
executable (glob), the pod's Kubernetes namespace and the container's image (globs, as the
node names them: an unknown one never matches).  Safety rules: a deleted or memfd executable never
matches an ``exe`` entry; an entry that names neither a container nor a
cgroup only matches processes outside containers (an image can put anything
at ``/usr/bin/nvidia-smi``) unless it says ``any_container: true``; a
``sha256`` entry only matches when the hash was computed live from
``/proc/PID/exe`` (cached per executable identity).
"""

from __future__ import annotations

import fnmatch
from collections import OrderedDict
from dataclasses import dataclass

from gpuguard.config.yaml_marks import Position
from gpuguard.correlate.state import ProcessState
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.sources.proc.files import sha256_of_file

ENTRY_FIELDS = (
    "id",
    "exe",
    "sha256",
    "user",
    "cgroup",
    "container_id",
    "parent_exe",
    "namespace",
    "image",
    "any_container",
    "comment",
)
_HASH_CACHE_SIZE = 1024


@dataclass(slots=True)
class AllowEntry:
    id: str
    position: Position
    exe: str | None = None
    sha256: str | None = None
    user: str | None = None
    cgroup: str | None = None
    container_id: str | None = None
    parent_exe: str | None = None
    namespace: str | None = None  # the pod's Kubernetes namespace (glob)
    image: str | None = None  # the container's image as pulled (glob)
    any_container: bool = False
    comment: str = ""

    def matches(self, state: ProcessState) -> bool:
        facts = state.facts
        if facts is None:
            return False
        if (
            self.container_id is None
            and self.cgroup is None
            and self.namespace is None
            and self.image is None
            and not self.any_container
            and facts.container_id is not None
        ):
            return False
        # an unknown namespace or image never matches: the node must name it
        if self.namespace is not None and not (
            facts.pod_namespace and fnmatch.fnmatchcase(facts.pod_namespace, self.namespace)
        ):
            return False
        if self.image is not None and not (
            facts.container_image and fnmatch.fnmatchcase(facts.container_image, self.image)
        ):
            return False
        if self.exe is not None:
            if facts.exe_deleted or facts.exe_memfd or not fnmatch.fnmatchcase(facts.exe, self.exe):
                return False
            if self.sha256 is not None and state.exe_sha256 != self.sha256:
                return False
        if self.user is not None and facts.username != self.user:
            return False
        if self.cgroup is not None and not fnmatch.fnmatchcase(facts.cgroup, self.cgroup):
            return False
        if self.container_id is not None and facts.container_id != self.container_id:
            return False
        if self.parent_exe is not None:
            if not facts.ancestors or not fnmatch.fnmatchcase(
                facts.ancestors[0].exe, self.parent_exe
            ):
                return False
        return True


class Allowlist:
    """The merged allowlist entries, in file order; the first match wins."""

    def __init__(self, entries: list[AllowEntry]) -> None:
        self.entries = entries
        self._hash_patterns = [e.exe for e in entries if e.sha256 and e.exe]
        self._hashes: OrderedDict[tuple, str | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def match(self, state: ProcessState) -> AllowEntry | None:
        for entry in self.entries:
            if entry.matches(state):
                return entry
        return None

    def exe_sha256_if_needed(self, facts: ProcessFacts, proc_root: str = "/proc") -> str | None:
        """Hash ``/proc/PID/exe`` when an entry pins a hash for this path (live only; cached)."""
        if not facts.exe or not any(fnmatch.fnmatchcase(facts.exe, p) for p in self._hash_patterns):
            return None
        cache_key = facts.exe_identity or (facts.pid, facts.start_time)
        if cache_key in self._hashes:
            self._hashes.move_to_end(cache_key)
            return self._hashes[cache_key]
        digest = sha256_of_file(f"{proc_root}/{facts.pid}/exe")
        self._hashes[cache_key] = digest
        if len(self._hashes) > _HASH_CACHE_SIZE:
            self._hashes.popitem(last=False)
        return digest
