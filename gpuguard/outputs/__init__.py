"""Outputs: terminal views, the agent's SIEM log (ECS, OCSF, CEF to a file, stdout or syslog) and its Prometheus metrics."""
