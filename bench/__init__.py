"""Snapflow benchmarks: ``python -m bench [name]`` (``make bench [BENCH=name]``).

Each benchmark prints a table and writes ``bench/results/<name>.json`` as
``{"metrics": {name: number}, "targets": {...}, "environment": {...}}``. Timings on shared
machines are noisy: compare ratios measured within one run, not absolute numbers across runs.
"""
