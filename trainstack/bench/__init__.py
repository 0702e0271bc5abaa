"""Benchmarks of trainstack itself (`make bench-preview`)."""
