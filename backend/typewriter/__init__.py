"""Typewriter: stream a TensorFlow language model's answer token by token."""

__version__ = "0.1.0"
