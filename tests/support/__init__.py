"""Helpers shared by the tests: the C workload and the private-/dev namespace."""
