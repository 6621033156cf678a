"""What a model is, whatever runs it: its config, its family and where each weight lives in a file."""
