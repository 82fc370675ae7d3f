"""The output format list: names, scan options and the default are each stated once."""

from __future__ import annotations

from gpuguard.agent.config import AgentConfig
from gpuguard.commands import scan
from gpuguard.outputs.records import FORMATS, OUTPUT_FORMATS, SCAN_FORMATS


def test_names_and_scan_options_are_unique_and_the_default_comes_first():
    assert len(set(FORMATS)) == len(OUTPUT_FORMATS)
    assert len(SCAN_FORMATS) == sum(1 for f in OUTPUT_FORMATS if f.scan_option)
    assert AgentConfig().log_format == FORMATS[0]  # agent --log-format says "(default)" of it


def test_scan_offers_the_console_table_and_every_format_with_a_scan_option():
    assert scan.FORMATS == ("table", *(f.scan_option for f in OUTPUT_FORMATS if f.scan_option))
    for fmt in SCAN_FORMATS.values():
        assert fmt.scan_help and fmt.scan_schema["name"] and fmt.mark_path
