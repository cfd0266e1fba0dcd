"""The options of the prefix cache's tiers below the GPU (``sim/tiers.py``), shared by the commands that replay."""

from __future__ import annotations

from typing import Annotated

import typer

from minipaged_cli.cli.common import flag
from minipaged_cli.sim.settings import OFFLOAD_POLICIES, TIER_EVICTIONS, TIER_INCLUSIONS

CpuKvMemoryOpt = Annotated[str | None, typer.Option(
    "--cpu-kv-memory", metavar="SIZE", show_default=False,
    help="A host-memory tier under the GPU's prefix cache (64GiB, 1TiB; 0: none), copied over the GPU preset's "
         "host link (host_bandwidth_bytes_per_s x host_bandwidth_efficiency). Needs prefix caching (v1); under "
         "--scheduler v0 it is also the swap space of --preemption swap, whose copies cross the same link.")]
DiskKvMemoryOpt = Annotated[str | None, typer.Option(
    "--disk-kv-memory", metavar="SIZE", show_default=False,
    help="A local-disk tier under the host tier (needs --cpu-kv-memory), at the GPU preset's "
         "disk_read_bytes_per_s / disk_write_bytes_per_s.")]
OffloadPolicyOpt = Annotated[str, typer.Option(
    "--offload-policy",
    help="When a block goes down a tier: " + " or ".join(OFFLOAD_POLICIES) + ". write-through: every computed full "
         "block, after its step (vLLM's OffloadingConnector, LMCache); on-eviction: when the tier above evicts it "
         "(write-back, SGLang HiCache's and Dynamo KVBM's). A step's stores queue on the link; they are dropped "
         "(counted) when they and the blocks still in flight would not fit in the tier.")]
TierEvictionOpt = Annotated[str, typer.Option(
    "--tier-eviction",
    help="How the host and disk tiers evict: " + " or ".join(TIER_EVICTIONS) + " (lru: least recently used; arc: "
         "adaptive replacement, vLLM's ARC policy, which keeps blocks reused twice over blocks seen once; under "
         "--tier-inclusion exclusive a reused block leaves the tier, so ARC acts nearly as LRU).")]
TierInclusionOpt = Annotated[str, typer.Option(
    "--tier-inclusion",
    help="Whether a block the GPU caches stays in the tiers below: " + " or ".join(TIER_INCLUSIONS) + ". "
         "inclusive: a load copies, the tier keeps its copy (vLLM's OffloadingConnector CPU LRU, LMCache, SGLang "
         "HiCache); exclusive: a load moves the block up and it leaves the tier it came from, as does any block "
         "the GPU computes, so each block is in one tier (a victim-cache hierarchy; none of those systems ships "
         "it: it shows what inclusivity costs). exclusive needs --offload-policy on-eviction.")]
LayerwiseLoadsOpt = Annotated[bool, flag(
    "layerwise-loads",
    help="A load overlaps the request's prefill layer by layer (LMCache's layerwise mode); off: the request waits "
         "for the whole load first, as vLLM's connector does (WAITING_FOR_REMOTE_KVS).")]
