"""The shared test kit: harnesses, polling, helpers and fault injection used across the suites."""
