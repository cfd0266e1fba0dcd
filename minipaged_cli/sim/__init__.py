"""The simulator: a continuous-batching replay of a trace under each allocation strategy, and the accounting
of where the KV memory goes. Imports no torch."""
