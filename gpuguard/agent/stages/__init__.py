"""The agent's flow, one stage per module, in flow order.

produce (:mod:`.s1_produce`: sensor, samplers, /proc sweeps) -> enrich (:mod:`.s2_enrich`:
process facts, config files, YARA) -> correlate (:mod:`.s3_correlate`) -> score
(:mod:`.s4_score`: the detection engine's verdicts, kept by the correlator) -> report
(:mod:`.s5_report`: process, guard and GPU host findings) -> act (:mod:`.s6_act`: the
responder and its outcomes) -> emit (:mod:`.s7_emit`: the log).  Each stage keeps its own
counters (``counts``).  Feedback against the flow goes through explicit queues
(:mod:`gpuguard.agent.feedback`).  :mod:`gpuguard.agent.pipeline` builds and orders them.

May import: every layer below the agent and the agent's own modules (context, feedback,
producers, findings...); never :mod:`gpuguard.agent.pipeline` nor another stage's internals
beyond the stage object passed in.
"""
