"""The two runtimes that compute engine steps: xla/ (TensorFlow, jit_compile) and lite/ (int8 LiteRT programs)."""
