"""The `int8-lite` weight format: the model's matrices as int8 in TensorFlow Lite programs that XNNPACK runs,
attention and the K/V cache on the host beside them (see runner.py)."""
