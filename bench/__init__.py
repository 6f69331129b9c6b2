"""Snapflow benchmarks: ``PYTHONPATH=tests python -m bench [name]`` (``make bench [BENCH=name]``).

``tests/`` is on the path for the test kit's ``kit.simulated_agent`` (the coordinator benchmark's
agents), which is not part of the wheel.

Each benchmark prints a table and writes ``bench/results/<name>.json`` as
``{"metrics": {name: number}, "targets": {...}, "environment": {...}}``. Timings on shared
machines are noisy: compare ratios measured within one run, not absolute numbers across runs.
"""
