"""benchmarks/bare_driver.py and benchmarks/harness.py for the probes in
tools/ (run as scripts, or imported with tools/ on sys.path)."""
import os
import sys


def bench_modules():
    """(bare_driver, harness), from benchmarks/ beside tools/."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        os.pardir, "benchmarks")
    if here not in sys.path:
        sys.path.insert(0, here)
    import bare_driver
    import harness
    return bare_driver, harness
