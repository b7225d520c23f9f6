"""Benchmarks (bench_*.py) and the chaos run (chaos.py), each run as ``python scripts/NAME.py``.

A package only so that the tests can import ``scripts.services`` (the stand-in services both start);
the scripts themselves import it as ``services``, from their own folder.
"""
