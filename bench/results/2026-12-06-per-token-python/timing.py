"""The study's timer: `timed(function, label, took)` calls `function` and adds its nanoseconds to took[label]."""
import time


def timed(function, label, took):
    def call(*args, **kwargs):
        began = time.perf_counter_ns()
        out = function(*args, **kwargs)
        took[label].append(time.perf_counter_ns() - began)
        return out
    return call
