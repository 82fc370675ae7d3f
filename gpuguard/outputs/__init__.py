"""Outputs: terminal views, SIEM JSON (ECS, OCSF) and metrics."""
