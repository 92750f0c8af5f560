"""Helpers shared by tests, examples and benchmarks: reference models and their numpy twins."""
