"""Fleets: many replicas of the engine behind a router, prefill/decode disaggregation, a KV store they share."""
