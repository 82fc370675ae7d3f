"""Allows ``python -m gpuguard``."""

from gpuguard.cli import main

raise SystemExit(main())
