"""Accuracy evaluation: task metrics as pure functions, and thin loops that feed models."""
