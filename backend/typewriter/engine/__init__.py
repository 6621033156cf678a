"""The engine: requests, scheduling, sampling and the step loop; no TensorFlow, no transformers."""
