"""One module per CLI command; each only wires stages together."""
