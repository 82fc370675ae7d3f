"""The config layer: YAML with positions, the file checks, one declarative schema and its reference.

``yaml_marks`` reads YAML keeping every value's ``file:line:col`` (bounded depth
and alias expansion); ``filecheck`` opens only regular files and refuses ones a
non-root user could have written; ``schema`` declares keys (type, range or
choices, doc; defaults are the owner's dataclass's) and checks a mapping against
them; ``reference`` renders a schema as the commented YAML the docs show.

May import: ``gpuguard.errors`` and ``gpuguard.escape`` only (it sits below every other layer,
and every layer may import it).
"""
