"""One module per interactive CLI command."""
