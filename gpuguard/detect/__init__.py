"""Detection: rules, signals, YARA and scoring into an explainable verdict per process.

Rule files are read with positions and limits (``yaml_marks``, ``filecheck``),
collected, validated and compiled (``rules`` the loader, ``rule_collect``,
``conditions``) into the model (``rule_model``), and found in one place
(``shipped``).  ``signals`` and ``behaviour_signals`` compute the named values
rule conditions test, ``signal_table`` lists them once (``signal_reader`` reads
them lazily, ``rescore`` says what each depends on);
``yara_scan`` and ``yara_persistent`` scan executables and memory,
``allowlist`` exempts known-good processes, ``score`` turns matched rules into
a :class:`~gpuguard.detect.scoring.score.Verdict` and ``engine`` scores the
correlator's processes, parents first.  ``reload`` swaps rule sets in
long-running commands, ``cases`` replays golden cases for rule authors and
``host_checks`` (with ``gpu_host_checks`` and ``tuning_host_checks``) judges
host-wide findings for ``scan`` by the rows of ``host_rules``.  Registries are
explicit lists: nothing registers itself on import.

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events``,
``gpuguard.sources``, ``gpuguard.correlate`` and itself; never respond, outputs
or commands (tests/test_layers.py).
"""
