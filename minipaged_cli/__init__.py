"""minipaged: paged KV-cache memory management for LLM inference: simulate, run, verify, profile."""

__version__ = "0.1.0"
