"""The agent: the daemon that runs sensor, samplers, correlator, scoring, actions and logs together.

Data flow, one module per stage:

* :mod:`.config` — agent.yaml and its defaults;
* :mod:`.intake` — the bounded queue every producer feeds (drops are counted);
* :mod:`.counters` — every counter, in one plain object (state file, metrics, summary);
* :mod:`.producers` — the sensor thread, one sampler thread per GPU source,
  and the /proc sweep (start-up seed; periodic in reduced mode);
* :mod:`.pipeline` — the detect loop: correlator and detection engine
  (:mod:`gpuguard.detect.scoring.engine`), guard policies, findings, actions, block expiry;
* :mod:`.telemetry` — the SIEM log (:mod:`gpuguard.outputs.log_writer`) and the
  Prometheus metrics (:mod:`gpuguard.outputs.metrics`), fed from the counters;
* :mod:`.actions` — the action interface the responder plugs into;
* :mod:`.status_file` — the root-only state file ``gpuguard status`` reads.

The tools that prove the agent works (selftest, simulator, enforce scope) live in
:mod:`gpuguard.proving`, above this package.

May import: every layer below it (errors, escape, events, sources,
correlate, detect, respond, outputs); proving, commands and cli sit above
it (tests/test_layers.py).
"""
