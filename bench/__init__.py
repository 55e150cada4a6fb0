"""Benchmarks: each prints figures; none asserts a time. Not shipped with the package."""
