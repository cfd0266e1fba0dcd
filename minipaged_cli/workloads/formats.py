"""The trace formats ``load_trace`` reads (``readers.py``), by name: in a module of their own, so that the command
line lists them in its help without importing the readers (and NumPy)."""

TRACE_FORMATS = ("auto", "yaml", "azure", "mooncake", "lengths-csv", "aiperf", "sharegpt", "genai-perf",
                 "inference-perf", "vllm-multi-turn", "prefix-repetition")
