"""Benchmarks against the local stack; each prints ratios against its goal and the command to reproduce."""
