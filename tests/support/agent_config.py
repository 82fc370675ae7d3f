"""An agent config file written as the agent accepts one: root's, 0600, in a 0700 directory."""

from __future__ import annotations

import os
from pathlib import Path


def write(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    os.chmod(path, mode)
    os.chmod(tmp_path, 0o700)
    return path
