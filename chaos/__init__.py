"""Snapflow's chaos suite: seeded, replayable fault injection against real processes.

``python -m chaos --seed 7`` (``make chaos SEED=7``) runs the full suite (see ``chaos.suite``
for the scenarios and docs/chaos.md for the figures); ``--quick`` runs the short subset that
the test suite runs. Results: ``bench/results/chaos.json`` as ``{"metrics": {...}}``.
"""
