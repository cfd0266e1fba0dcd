"""Workloads: the trace model and its YAML format, readers of public traces, and the model and GPU presets."""
