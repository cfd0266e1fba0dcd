"""The scheduler: queues, admission, preemption and parallel sampling, under one allocation strategy.

Over 300 lines: one class, vLLM v1's policy, whose running pass, waiting pass, preemption and sampling share the
queues and the step's budget (vLLM keeps them in one ``schedule`` too), and this docstring.

``schedule`` returns what the step runs as a ``StepDecision`` (vLLM's ``SchedulerOutput``); the replay loop times
the step, runs it, and reports back (``prefilled`` after a prefill, ``finish`` at the end). ``Scheduler`` here is
vLLM v1's policy; ``V0Scheduler`` (``scheduler_v0.py``) vLLM v0's; ``EngineSettings.scheduler`` picks one.

``v1`` (vLLM v1's ``Scheduler.schedule``, vllm/v1/core/sched/scheduler.py, as in vLLM 0.33.0 and 0.34.0): one budget
of ``max_batched_tokens`` a step. Running requests first, in their order: each gets what it still has to compute
(one token for a decode, the rest of its prompt otherwise, at most ``long_prefill_token_threshold`` when set),
capped by the budget left, and the blocks for it; when the pool cannot give them the last running request is
preempted (recomputed later, to the front of the queue), possibly the request itself. Then, if nobody was preempted,
waiting requests first come first served while budget and ``max_num_seqs`` allow: a request's prefix-cache hit is
looked up, the strategy admits it only if its whole prompt would fit (``scheduler_reserve_full_isl``, with the
watermark while something runs) and allocates its first chunk; full blocks join the prefix cache as they are
allocated, so a request admitted later in the same step hits them. ``n`` > 1 arrives as ``n`` requests sharing the
prompt through the prefix cache (v1's parallel sampling). vLLM 0.34.0's cache-aware admission
(``cache_aware_admission_window``, off by default): before the waiting pass, while the KV cache's usage is at least
the threshold, the first N waiting requests that were never admitted are reordered deepest cached prefix first, in
place among themselves (``_reorder_waiting_by_cached_prefix``).

Not modelled, because a trace cannot reach it or it is off in ``vllm serve``'s defaults: partial-prefill limits
(``max_num_partial_prefills``: its long-prefill threshold defaults to 0 when it is 1, the default, and v1's
``schedule`` enforces no concurrent-prefill limit), the ``max_model_len`` cap on a step's tokens (only speculative
decoding reaches it; a request longer than ``max_model_len`` is rejected whole here, where vLLM would cut its
output), encoder budgets, LoRA limits, KV connectors and priority scheduling.

With prefix caching a request's full blocks carry content keys (its shared segments, then its own prompt, then
each sample's output), and a chunk's blocks join the cache when the chunk is scheduled, never before. A waiting
request's keys are built when it nears the queue's head (``_enqueue``): only the first waiting requests are read.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.prefix import segment_keys
from minipaged_cli.sim import request_loops
from minipaged_cli.sim.accounting import Accounting
from minipaged_cli.sim.admission import AdmissionPolicy
from minipaged_cli.sim.clients import OPEN_LOOP, Arrivals, Clients
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.private_keys import applies, private_keys, shared_segments
from minipaged_cli.sim.settings import CacheSettings, EngineSettings
from minipaged_cli.workloads.trace import Request, Trace

if TYPE_CHECKING:
    from minipaged_cli.sim.tiers import TieredCache


@dataclass
class StepDecision:
    """What one step runs, as the scheduler decided it.

    ``decoders`` write one token each; ``chunks`` prefill (request, tokens). ``copies``: (src, dst) blocks that
    copy-on-write needs copied before any token is written; ``copied_tokens``: K/V tokens copied in all
    (copy-on-write, extents moved or forked); ``swapped_tokens``: K/V tokens over the host link (swap out and in);
    ``forks``: (parent, child) sequences forked after the previous step's prefill. ``saturated``: a request waits
    for memory (or one was preempted). ``transfer_s``: with a host tier (``sim/tiers.py``), the seconds the forward
    waits for the copies over its link that v0 issues before it (swaps, loads), queued on the link's clock.
    """

    decoders: list[LiveRequest]
    chunks: list[tuple[LiveRequest, int]]
    copies: list[tuple[int, int]] = field(default_factory=list)
    copied_tokens: int = 0
    swapped_tokens: int = 0
    forks: list[tuple[int, int]] = field(default_factory=list)
    saturated: bool = False
    transfer_s: float = 0.0

    @property
    def num_new_tokens(self) -> int:
        """Tokens whose K/V the step writes: one per decoder, and every chunk's."""
        return len(self.decoders) + sum(c for _, c in self.chunks)


class Scheduler:
    """vLLM v1's scheduling (the module docstring); ``V0Scheduler`` overrides ``schedule`` and what differs."""

    samples_at_arrival = True  # v1 splits parallel sampling into n requests (its ParentRequest)

    def __init__(self, trace: Trace, engine: EngineSettings, cache: CacheSettings, allocator: Allocator,
                 accounting: Accounting, *, model_len: int, clients: Clients = OPEN_LOOP, swap_blocks: int = 0,
                 watermark_blocks: int = 0) -> None:
        self.engine, self.cache, self.model_len = engine, cache, model_len  # as SimConfig resolved them
        self.prefill_token_limit = engine.prefill_token_limit(model_len)
        self.swap_blocks = swap_blocks  # v0's swap space (SimConfig.swap_blocks)
        self.allocator = allocator
        self.accounting = accounting
        self.arrivals = Arrivals(trace, clients)  # who sends what when (sim/clients.py)
        self.segments = trace.segments
        self.next_sequence_id = len(trace.requests)  # forked samples are numbered after the requests
        self.waiting: deque[LiveRequest] = deque()
        self.waiting_needs: list[int] = []  # sorted admission needs of the waiting requests
        self.running: list[LiveRequest] = []
        # when admission leaves the watermark's blocks free (SimConfig.watermark_blocks): the engine's rule
        self.admission = AdmissionPolicy.for_engine(engine.scheduler, watermark_blocks)
        self.keyed = bool(cache.prefix_caching) and allocator.supports_prefix_caching  # blocks get content keys
        # vLLM 0.34.0 reorders only with a prefix cache to consult
        self.cache_aware_window = engine.cache_aware_admission_window if self.keyed else 0
        self.keyed_span = max(self.cache_aware_window, 1)  # the first waiting requests, which have their keys
        self.prefill_cap = 0  # this step's long-prefill threshold
        self.head_headroom: int | None = None  # the queue's head's headroom as ``_head_admissible`` last found it
        self.passes = request_loops.loops()  # (the passes over the running requests, compiled where they build)
        self.now = 0.0  # the replay's clock at the last arrive()
        self.tiers: TieredCache | None = None  # the prefix cache's tiers below the GPU (sim/tiers.py), if any
        self.loads: list[tuple[Hashable, int]] = []  # (hash, GPU block) loaded for the step being scheduled
        # A fleet's replica (fleet/replica.py) hands its scheduler the requests its router sent (its own
        # ``arrivals``), and ``fleet_indices``: each one's index in the fleet's trace (what its own blocks' keys
        # name, so that two replicas' requests never share a key)
        self.fleet_indices: list[int] | None = None
        # The segments two or more of the trace's requests name, where a block whose content no other request names
        # carries ``PRIVATE`` for its key (``sim/private_keys.py``); None: every block its key. (A fleet's replica,
        # whose own trace is empty, is handed the fleet trace's.)
        self.shared_segments = shared_segments(trace.requests) if applies(engine, self.keyed, allocator) else None
        self.on_sample_done: Callable[[LiveRequest, float], None] | None = None  # told each finished sequence

    # -- state -------------------------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return self.arrivals.has_pending or bool(self.waiting) or bool(self.running)

    def idle_until(self, now: float) -> float:
        """Where the clock goes when no step could run at ``now``: while only loads from a tier below the GPU are
        in flight, to the first one's end (or to an arrival before it); else it stays."""
        ready = min((r.ready_s for r in self.running if r.loading_tokens), default=None)
        arrival = self.next_arrival_s
        if ready is None:
            return now
        return max(now, ready if arrival is None else min(ready, arrival))

    @property
    def next_arrival_s(self) -> float | None:
        return self.arrivals.next_arrival_s

    @property
    def can_bulk(self) -> bool:
        """Whether the next steps are decode-only and change nothing but lengths until some event: something
        runs, no prompt is mid-prefill, the budget serves every decode, and the queue's head cannot be admitted.
        Under cache-aware admission, one request waits at most: the reorder of two may put either first, at any
        step (the cache's usage and hits move).

        Asked before every step, the common noes first: the latest admitted request (the end of ``running``) still
        mid-prefill (a long prompt's chunks), then a head that fits (a request arrived while nothing waited; its
        prompt's hit is memoised), and only then the pass over the other running requests."""
        running = self.running
        if not running or len(running) >= self.engine.max_batched_tokens \
                or (self.cache_aware_window and len(self.waiting) > 1):
            return False
        latest = running[-1]
        if latest.num_computed < latest.num_prefill_tokens or self._head_admissible():
            return False
        return self.passes.all_prefilled(running)

    def waiting_for_memory(self) -> bool:
        """A step is saturated when the queue's head is held back by memory, not by a batch limit."""
        return self.admission_headroom() < 0

    def admission_headroom(self) -> int:
        """Slots the running requests may still take before the queue's head is held back by memory (negative:
        it is now); a large number when nothing waits."""
        if not self.waiting:
            return self.allocator.capacity_tokens
        head = self.waiting[0]
        return self.admission.headroom(self.allocator, head, head.num_prefill_tokens)

    def external_fragmentation(self) -> int:
        """Free slots in holes too small for the smallest waiting request's need."""
        if not self.waiting_needs:
            return 0
        return self.allocator.external_fragmentation(self.waiting_needs[0])

    # -- each step ---------------------------------------------------------------------------------------------

    def arrive(self, now: float) -> None:
        """Queue the requests that have arrived by ``now`` (rejecting those that can never run)."""
        self.now = now
        for index, request in self.arrivals.due(now):
            self.accounting.arrived(index, request.n)
            for sample in range(request.n if self.samples_at_arrival else 1):
                sequence_id = index if sample == 0 else self._new_sequence_id()
                live = LiveRequest(sequence_id, request.prompt_tokens, request.output_tokens, request=request,
                                   request_index=index, sample=sample,
                                   num_prefill_tokens=request.prompt_tokens,
                                   forked=self.samples_at_arrival)
                # (its blocks' keys are built when it nears the queue's head, ``_enqueue``: a count of 2**62
                # tokens is one rejection, not a list of 2**58 keys)
                if request.total_tokens > self.model_len:
                    self._reject(live, "longer than --max-model-len")
                elif (reason := self.admission.rejection_reason(self.allocator, live)) is not None:
                    self._reject(live, reason)
                else:
                    self._enqueue(live, front=False)

    def schedule(self) -> StepDecision | None:
        """The next step, or None when nothing can run in it (a request that preempted itself runs next step;
        a head that can never fit again is rejected)."""
        budget = self.engine.max_batched_tokens
        # The long-prefill threshold keeps one prompt from starving the others; alone, a request takes the budget.
        self.prefill_cap = self.engine.long_prefill_token_threshold \
            if len(self.running) + len(self.waiting) > 1 else 0
        decoders: list[LiveRequest] = []
        chunks: list[tuple[LiveRequest, int]] = []
        copied, preempted = 0, False
        index = 0
        batched = self.allocator.grows_in_batches
        while index < len(self.running) and budget > 0:
            live = self.running[index]
            if batched and live.num_computed >= live.num_prefill_tokens and not live.loading_tokens:
                # A run of decodes grows in one call (``Allocator.grow_decodes``); the first that cannot grow
                # goes on below, where the pool's answer is the same and preempts.
                run = self._decode_run(index, budget)
                grown = self.allocator.grow_decodes(run)
                decoders += run[:grown] if grown < len(run) else run
                budget -= grown
                index += grown
                if grown == len(run):
                    continue
                live = self.running[index]
            if live.loading_tokens:
                if live.ready_s > self.now:  # vLLM's WAITING_FOR_REMOTE_KVS: nothing to compute yet
                    index += 1
                    continue
                self._loaded(live)
            tokens = 1 if live.prefill_done else self._chunk(live.num_prefill_tokens - live.num_computed, budget)
            while True:
                moved = self.allocator.try_grow(live, live.num_computed, live.num_computed + tokens)
                if moved is not None:
                    break
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is live:
                    break
            if moved is None:
                break
            copied += moved
            if live.prefill_done:
                decoders.append(live)
            else:
                chunks.append((live, tokens))
            budget -= tokens
            index += 1
        held_back = False
        if not preempted:
            budget, held_back = self._admit(budget, chunks)
        # (a head that memory held back in ``_admit`` is the answer ``waiting_for_memory`` would work out again)
        saturated = preempted or held_back or self.waiting_for_memory()
        if not decoders and not chunks:
            if not self.running and not preempted:
                self._reject(self._dequeue(), "preempted, and its prompt plus generated tokens no longer fit")
            return None
        return StepDecision(decoders, chunks, copied_tokens=copied, saturated=saturated)

    def _decode_run(self, start: int, budget: int) -> list[LiveRequest]:
        """The running requests from ``start`` on that decode this step (prefill done, nothing loading), as many
        as the budget serves."""
        # (the caller has checked the first)
        return self.running[start:self.passes.decode_run_end(self.running, start + 1, start + budget)]

    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens a request computes this step: what it has left, at most the long-prefill threshold (while
        another request runs or waits) and the budget."""
        if 0 < self.prefill_cap < remaining:
            remaining = self.prefill_cap
        return min(remaining, budget)

    def _admit(self, budget: int, chunks: list[tuple[LiveRequest, int]]) -> tuple[int, bool]:
        """Admit waiting requests first come first served into what is left of the budget, each with its first
        chunk (a cache hit leaves at least its last prompt token to compute); returns the rest, and whether the
        queue's head is held back by memory (it stopped the admissions)."""
        if self.cache_aware_window:
            self._reorder_waiting_by_cached_prefix()
        accounting = self.accounting
        while self.waiting and budget > 0 and len(self.running) < self.engine.max_num_seqs:
            head = self.waiting[0]
            if not self.admission.can_admit(self.allocator, head, head.num_prefill_tokens):
                return budget, True
            cached = self.allocator.cached_prefix(head, head.num_prefill_tokens)
            loaded = 0
            if self.tiers is not None:
                loaded, head.ready_s = self.tiers.load(head.block_hashes, cached, head.num_prefill_tokens, self.now,
                                                       count_hits=not head.queried)
            if loaded:  # blocks now, compute once loaded (the running loop picks it up then)
                self.allocator.admit_loading(head, cached, loaded)
                head.loading_tokens = loaded
                self._note_loads(head, cached, cached + loaded)  # (the copy starts in this step, as vLLM's)
            else:
                tokens = self._chunk(head.num_prefill_tokens - cached, budget)
                self.admission.admit(self.allocator, head, head.num_prefill_tokens, cached + tokens)
            self.running.append(self._dequeue())
            head.num_computed = cached
            if self.keyed and not head.queried:  # a re-prefill is not a query (vLLM PR 25787)
                head.queried = True
                accounting.prefix_cache_queries += head.num_prefill_tokens
                accounting.prefix_cache_hits += cached
                head.num_cached_tokens = cached
            if not loaded:
                chunks.append((head, tokens))
                budget -= tokens
        return budget, False

    def _reorder_waiting_by_cached_prefix(self) -> None:
        """vLLM 0.34.0's cache-aware admission (``Scheduler._reorder_waiting_by_cached_prefix``): at a KV cache usage
        of at least the threshold, the requests among the first ``cache_aware_window`` waiting ones that were never
        admitted (a preempted one keeps its place, and nothing moves past it) take those same places deepest cached
        prefix first, arrival order breaking ties. The cache is only probed: no hit is counted."""
        usage = self.allocator.used_slots / self.cache.kv_capacity_tokens
        if len(self.waiting) < 2 or usage < self.engine.cache_aware_admission_threshold:
            return
        head = list(itertools.islice(self.waiting, self.cache_aware_window))
        slots = [i for i, live in enumerate(head) if not live.queried]
        cached = {i: self.allocator.cached_prefix(head[i], head[i].num_prefill_tokens) for i in slots}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        for slot, source in zip(slots, order, strict=True):
            self.waiting[slot] = head[source]

    def _loaded(self, live: LiveRequest) -> None:
        """A load from a tier below the GPU has finished: its tokens count as computed, its blocks join the
        GPU's prefix cache (the data plane filled them in the step that issued the load)."""
        live.num_computed += live.loading_tokens
        live.loading_tokens = 0
        self.allocator.mark_computed(live, live.num_computed)

    def _note_loads(self, live: LiveRequest, first: int, stop: int) -> None:
        """Hand the step's data plane the blocks of tokens ``first`` to ``stop`` that a tier fills (the load
        issued in this step: vLLM's worker starts its copy in the step the scheduler issues it)."""
        if self.allocator.windowed:  # (no data plane runs KV cache groups: a table per group)
            return
        first, stop = first // self.cache.block_size, stop // self.cache.block_size
        self.loads.extend(zip(live.block_hashes[first:stop], self.allocator.block_table(live.sequence_id)[first:stop],
                              strict=True))

    def prefilled(self, live: LiveRequest, now: float) -> None:
        """The request's prefill has just run (``V0Scheduler`` forks its samples then)."""

    def finish(self, now: float) -> None:
        """Release every request that has generated all its tokens."""
        for live in self.passes.finished(self.running):
            self.allocator.release(live)
            self.running.remove(live)
            self._sample_done(live, now)

    # -- admission, preemption ---------------------------------------------------------------------------------

    def _new_sequence_id(self) -> int:
        self.next_sequence_id += 1
        return self.next_sequence_id - 1

    def _head_admissible(self) -> bool:
        """Whether the first waiting request would be admitted now (ignoring this step's decode growth), asked
        when every running request decodes: the decodes alone may take the whole budget. Its headroom, where
        asked, stays in ``head_headroom`` (else None): the bulk that follows at once starts from it."""
        self.head_headroom = None
        if not self.waiting or len(self.running) >= self.engine.max_num_seqs:
            return False
        if self.engine.max_batched_tokens is not None and len(self.running) >= self.engine.max_batched_tokens:
            return False
        self.head_headroom = self.admission_headroom()
        return self.head_headroom >= 0

    def _enqueue(self, live: LiveRequest, *, front: bool) -> None:
        """Queue ``live`` at the front (preempted, or a sample forked later) or the tail (arrived). The first
        ``keyed_span`` waiting requests have their blocks' keys (``_build_keys``): only those are read (the
        admission's gate and hits, the cache-aware reorder, ``can_bulk``'s test of the head), and the others'
        would be most of a replay's memory (a Mooncake prompt is 750 keys; thousands wait behind a full pool)."""
        if front:
            self.waiting.appendleft(live)
            self._build_keys(live)
        else:
            self.waiting.append(live)
            if len(self.waiting) <= self.keyed_span:
                self._build_keys(live)
        if self.allocator.has_external_fragmentation:
            bisect.insort(self.waiting_needs, self.allocator.admission_need(live, live.num_prefill_tokens))

    def _dequeue(self) -> LiveRequest:
        live = self.waiting.popleft()
        if len(self.waiting) >= self.keyed_span:  # (the one that moved up into the keyed span)
            self._build_keys(self.waiting[self.keyed_span - 1])
        if self.allocator.has_external_fragmentation:
            del self.waiting_needs[bisect.bisect_left(self.waiting_needs,
                                                      self.allocator.admission_need(live, live.num_prefill_tokens))]
        return live

    def _preempt(self, victim: LiveRequest) -> None:
        """Recompute: drop the victim's KV; it prefills prompt + generated tokens again when readmitted, from the
        front of the queue."""
        self._drop(victim)
        victim.num_computed = 0
        victim.loading_tokens = 0  # a load in flight is wasted: its link time stays spent
        victim.num_prefill_tokens = victim.prompt_tokens + victim.num_generated
        self._enqueue(victim, front=True)

    def _drop(self, victim: LiveRequest) -> None:
        """What every preemption does first: the victim's blocks freed, out of the running list, counted. (A
        victim with private keys takes its own first: readmitted, it looks its content up.)"""
        if victim.private_keys:
            victim.block_hashes = self._content_keys(victim.request, victim.request_index, victim.sample)
            victim.private_keys = False
            self.allocator.name_private(victim, victim.block_hashes)
        self.allocator.release(victim)
        self.running.remove(victim)
        self.accounting.num_preemptions += 1

    def _reject(self, live: LiveRequest, reason: str) -> None:
        if self.tiers is not None and self.keyed:
            self.tiers.request_done(live.block_hashes, live.prompt_tokens)
        self.accounting.rejected_sample(live, reason)
        self._request_done(live, self.now)

    def _sample_done(self, live: LiveRequest, now: float) -> None:
        if self.tiers is not None and self.keyed:
            self.tiers.request_done(live.block_hashes, live.prompt_tokens)
        live.block_hashes = []  # the keys can be many; a finished sequence needs them no more
        self.accounting.sample_done(live, now)
        if self.on_sample_done is not None:
            self.on_sample_done(live, now)
        self._request_done(live, now)

    def _request_done(self, live: LiveRequest, now: float) -> None:
        """Tell the clients when a request's last sample is done (what waits for it may be sent)."""
        index = live.request_index
        if not self.accounting.samples_left.get(index):
            self.arrivals.finished(index, now, completed=index not in self.accounting.rejected,
                                   cached_tokens=live.num_cached_tokens)

    def _build_keys(self, live: LiveRequest) -> None:
        """Give ``live`` its blocks' content keys (with prefix caching), unless it has them (a preempted request
        keeps its own)."""
        if self.keyed and not live.keys_built:
            request, shared = live.request, self.shared_segments
            # (its own keys are its alone where it has one sample, no runs and no output segment; a P/D decode
            # replica's transfers, in the tiers' place, name its keys)
            if shared is not None and self.tiers is None and request.n == 1 and not request.runs \
                    and request.output_segment is None:
                live.block_hashes = private_keys(request, self.segments, shared, self.cache.block_size)
                live.private_keys = True
            else:
                live.block_hashes = self._content_keys(request, live.request_index, live.sample)
            live.keys_built = True

    def _content_keys(self, request: Request, request_index: int, sample: int) -> list[Hashable]:
        """Keys of a sequence's full blocks (``content_keys``), its own named by its index in the fleet's trace
        when it runs on a fleet's replica."""
        if self.fleet_indices is not None:
            request_index = self.fleet_indices[request_index]
        return content_keys(request, request_index, sample, self.segments, self.cache.block_size)


def content_keys(request: Request, request_index: int, sample: int, segments: dict[str, int],
                 block_size: int) -> list[Hashable]:
    """Keys of a sequence's full blocks: its shared segments, then its own prompt tokens, then the output of this
    sample. Only the segments can match another request's; the rest lets a recomputed sequence find its own blocks
    while they are still cached. A session's turn names its history and input as later turns name them, then its
    output. (A fleet's router names a request's blocks with it too.) The segments' runs are not listed
    (``segment_keys``): a Mooncake prompt is dozens of segments, and every admitted request's keys are built."""
    if request.runs:
        own = [*request.runs, (request.output_label, request.output_tokens)]
    else:
        shared = sum(map(segments.__getitem__, request.prefix))  # (a name missing raises KeyError, as it would below)
        own = [(("prompt", request_index), request.prompt_tokens - shared),
               (request.output_segment or ("output", request_index, sample), request.output_tokens)]
    return segment_keys(request.prefix, segments, own, block_size)
