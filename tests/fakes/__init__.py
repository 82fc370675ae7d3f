"""Faithful fakes of the vendor GPU libraries (pynvml, amdsmi) for adapter tests."""
