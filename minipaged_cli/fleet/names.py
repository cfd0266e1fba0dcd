"""The fleet's names and defaults: the routers, the prefix indexes, the weighted router's scorers, the roles.

Apart from ``config.py`` so that ``simulate``'s options (whose help lists the routers) can name them without
importing the fleet's configuration, which a one-engine run never builds.
"""

ROUTERS = ("round-robin", "least-loaded", "prefix-aware", "session-affinity", "weighted")
PREFIX_INDEXES = ("precise", "approximate")  # llm-d's two prefix scorers
WEIGHT_NAMES = ("prefix", "queue", "kv", "session")
ROLES = ("mixed", "prefill", "decode")
DEFAULT_WEIGHTS = (("prefix", 2.0), ("queue", 1.0), ("kv", 1.0))  # llm-d's default scorer weights
DEFAULT_INDEX_CAPACITY = 1 << 20  # blocks the approximate index remembers
