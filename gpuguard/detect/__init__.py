"""Detection: rules, signals, YARA and scoring into an explainable verdict per process.

Rule files are read with positions (``yaml_marks``), merged and compiled
(``rules``, ``conditions``), checked for safe ownership (``filecheck``) and
found in one place (``shipped``).  ``signals`` computes the named values the
rule conditions test, ``yara_scan`` scans executables and memory,
``allowlist`` exempts known-good processes, ``score`` turns matched rules into
a :class:`~gpuguard.detect.score.Verdict`, ``reload`` swaps rule sets in
long-running commands and ``cases`` replays golden cases for rule authors.
"""
