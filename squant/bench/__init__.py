"""Benchmarking: timing, built-in model configs, variants, multi-instance runs, roofline."""
