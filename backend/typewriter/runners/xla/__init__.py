"""The XLA runtime: the TensorFlow decoder, compiled per shape bucket (jit_compile=True)."""
