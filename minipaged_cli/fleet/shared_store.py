"""One KV store shared by every replica: the host and disk tiers below the GPUs as one pool (Mooncake's store,
LMCache's shared backend). Each replica keeps its own links to it (its PCIe or NIC: the same bandwidths as its own
tiers), its own stores in flight and loads pinned; what is held is one store, so a block one replica stored is a
hit for all. The store's size is the tier's (``--cpu-kv-memory``), once for the fleet."""

from __future__ import annotations

from collections.abc import Sequence

from minipaged_cli.fleet.replica import Replica


def share_tiers(replicas: Sequence[Replica]) -> None:
    """Every replica's tiers read and write the first one's stores."""
    first = replicas[0].replay.tiers
    for replica in replicas[1:]:
        tiers = replica.replay.tiers
        if first is None or tiers is None:
            continue
        for tier, shared in zip(tiers.tiers, first.tiers, strict=True):
            tier.store = shared.store
