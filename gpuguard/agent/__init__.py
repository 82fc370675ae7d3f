"""The agent: the daemon that runs sensor, samplers, correlator, scoring, actions and logs together.

The flow is its file layout: :mod:`.pipeline` runs the start-up steps (:mod:`.startup`), which
build the stages in :mod:`.stages` (s1_produce .. s7_emit) once (:mod:`.wiring`), then orders
them each loop turn; :mod:`.housekeeping`, :mod:`.reload` and :mod:`.teardown` hold the rest
of its life.  What the stages share is in :mod:`.context`; work that goes back against the
flow travels through the queues in :mod:`.feedback`.  The module map is in
docs/internals.md ("agent"); selftest, simulator and enforce scope are in
:mod:`gpuguard.proving`.

May import: every layer below it (errors, escape, events, sources, correlate, detect,
respond, outputs); proving, commands and cli sit above it (tests/test_layers.py).
"""
