"""kill-on-touch's parts: what a block names, the kernel maps, the user-space match, the breaker.

``target`` decides what a block may name; ``maps`` is the kernel-map side (the program's
pinned maps, and lifting or re-arming a block through its pins); ``match`` matches exec
reports and knows the offender's exact copies; ``names`` keeps what kill records name;
``breaker`` stops a block that kills the innocent; ``blocker`` puts them together as the
loaded program.  The action itself: :mod:`gpuguard.respond.actions.kill_on_touch`.

May import: what ``gpuguard.respond`` may, its lower modules (``blocks``, ``bpf_pins``) and
itself; never the responder, the actions or their context.
"""
