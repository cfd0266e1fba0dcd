"""vLLM v0's scheduling (the engine the vLLM paper measured; removed from vLLM since), kept as ``--scheduler v0``.

Unchunked (``max_batched_tokens`` None, v0's default, ``_schedule_default`` in vllm/core/scheduler.py of vLLM
0.6): unless the queue's head is swapped out, a step first admits waiting requests first come first served while
the strategy can place their whole prompt (the paged strategy keeps the watermark free) and
``prefill_token_limit`` allows, and a step that admits any prefills those prompts whole and nothing else: no
decode runs in it ("Don't schedule decodes if prefills are scheduled"). Otherwise every decoding request grows by
one token, preempting the latest admitted request while the pool cannot give it (the victim swaps out to a CPU
pool of ``SimConfig.swap_blocks`` if it has room, else is recomputed later), and, if nobody was preempted,
swapped-out requests at the head of the queue come back in.

Chunked (``--max-batched-tokens`` given: v0's ``enable_chunked_prefill``, ``_schedule_chunked_prefill``) mixes
them: the decodes grow first, then waiting requests are admitted and the rest of the budget goes to prefill chunks
in admission order. A request with ``n`` > 1 forks its other samples after its prefill, sharing the prompt's blocks
until copy-on-write.

With a host tier (``--cpu-kv-memory``, ``sim/tiers.py``) the CPU pool is that tier: swapped-out blocks take its
slots, and every swap and every load from it is a copy over its link that the step's forward waits for, in the
order the step decides them (``forward_start``); with prefix caching a prompt's blocks found in the tier are loaded
when that is faster than recomputing them.
"""

from __future__ import annotations

from typing import Any

from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.scheduler import Scheduler, StepDecision


class V0Scheduler(Scheduler):
    """vLLM v0's policy (the module docstring), with swap preemption and forked samples."""

    samples_at_arrival = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cpu_capacity = self.swap_blocks * self.cache.block_size  # swap space, slots
        self.cpu_used = 0
        self.forward_start = 0.0  # when this step's forward may start: after its copies over the host tier's link
        self.swapped_tokens = 0  # moved over the host link since the last step was scheduled
        self.fork_copy_tokens = 0  # copied by contiguous forks since the last step was scheduled
        self.pending_forks: list[tuple[int, int]] = []  # for the next step's decision
        self.forked = False  # forks since the last single step: their shared last blocks need copy-on-write

    @property
    def can_bulk(self) -> bool:
        """Decode-only until some event: as v1's, and no fork awaits its copy-on-write, no swap its time."""
        # Without chunking every prompt is prefilled whole in the step that admits it.
        chunked = self.engine.max_batched_tokens is not None
        return bool(self.running) and not (chunked and any(not r.prefill_done for r in self.running)) \
            and not self.forked and not self.swapped_tokens and not self._head_admissible()

    def schedule(self) -> StepDecision | None:
        self.forward_start = self.now
        copied, self.fork_copy_tokens = self.fork_copy_tokens, 0
        chunked = self.engine.max_batched_tokens is not None
        if not chunked and not (self.waiting and self.waiting[0].swapped_slots):
            # v0's default (``_schedule_default``): prompts first, unless a swapped-out request comes back first;
            # "don't schedule decodes if prefills are scheduled": every running request stalls for that step.
            saturated = self.waiting_for_memory()
            if self._admit_prompts(self.prefill_token_limit, swapped_only=False):
                return self._decision([], copied, saturated)
        decoders, preempted, moved = self._grow_decoders()
        copied += moved
        saturated = preempted or self.waiting_for_memory()
        if not preempted:
            # Chunked, what is left of the budget goes to waiting prompts after the decodes (v0 mixes them);
            # unchunked, only swapped-out requests come back in a decode step.
            budget = self.prefill_token_limit - (len(decoders) if chunked else 0)
            self._admit_prompts(budget, swapped_only=not chunked)
        if not self.running:
            if not preempted:
                # Nothing runs and the head still does not fit: it never will (only reachable when its
                # recompute prompt outgrew what the strategy can place); reject it so the replay ends.
                self._reject(self._dequeue(), "preempted, and its prompt plus generated tokens no longer fit")
            return None
        return self._decision(decoders, copied, saturated)

    def _grow_decoders(self) -> tuple[list[LiveRequest], bool, int]:
        """Every decoding request grows by one token, the latest admitted preempted while the pool cannot give it;
        returns the decoders left, whether any was preempted, and the tokens copied for the growth."""
        decoders = [r for r in self.running if r.prefill_done]
        copied = 0
        preempted = False
        for live in decoders:
            while live in self.running:
                moved = self.allocator.try_grow(live, live.num_computed, live.num_computed + 1)
                if moved is not None:
                    copied += moved
                    break
                self._preempt(self.running[-1])
                preempted = True
        if preempted:
            decoders = [r for r in decoders if r in self.running]
        self.forked = False
        return decoders, preempted, copied

    def _decision(self, decoders: list[LiveRequest], copied: int, saturated: bool) -> StepDecision:
        """The step: ``decoders``, and the prefill of every running prompt, whole (admitted this step) or in
        chunks of what the decodes leave of the budget, in admission order."""
        copies = self.allocator.take_copies()
        copied += len(copies) * self.cache.block_size
        budget = self.prefill_token_limit - len(decoders)
        chunks: list[tuple[LiveRequest, int]] = []
        for live in self.running:
            if live.prefill_done:
                continue
            chunk = live.num_prefill_tokens - live.num_computed
            if self.engine.max_batched_tokens is not None:
                chunk = min(chunk, budget)
                if chunk <= 0:
                    break
                budget -= chunk
                self.allocator.mark_computed(live, live.num_computed + chunk)  # its blocks may be cached now
            chunks.append((live, chunk))
        swapped, self.swapped_tokens = self.swapped_tokens, 0
        forks, self.pending_forks = self.pending_forks, []
        return StepDecision(decoders, chunks, copies, copied, swapped, forks, saturated,
                            transfer_s=self.forward_start - self.now)

    def prefilled(self, leader: LiveRequest, now: float) -> None:
        if leader.request.n > 1 and not leader.forked:
            self._fork_samples(leader, now)

    def _fork_samples(self, leader: LiveRequest, now: float) -> None:
        """Parallel sampling: the other n - 1 sequences, each with its own first token, from the leader's prompt.
        A sample that cannot be forked (no room for a contiguous copy, or the batch is full) waits to prefill."""
        leader.forked = True
        for sample in range(1, leader.request.n):
            child = LiveRequest(self._new_sequence_id(), leader.prompt_tokens, leader.output_tokens,
                                request=leader.request, request_index=leader.request_index, sample=sample,
                                num_computed=leader.num_computed, num_generated=leader.num_generated,
                                num_prefill_tokens=leader.num_prefill_tokens, first_token_s=leader.first_token_s,
                                queried=True, forked=True)
            self._build_keys(child)  # (forked, it holds the leader's blocks under them)
            if child.num_generated >= child.output_tokens:  # its only token came with the prefill
                self._sample_done(child, now)
                continue
            copied = None
            if len(self.running) < self.engine.max_num_seqs:
                copied = self.allocator.fork(leader, child, leader.num_computed)
            if copied is None:
                child.num_computed = 0
                child.num_prefill_tokens = child.prompt_tokens + child.num_generated
                self._enqueue(child, front=True)
                continue
            self.running.append(child)
            self.fork_copy_tokens += copied
            self.pending_forks.append((leader.sequence_id, child.sequence_id))
            self.forked = True

    def _admit_prompts(self, budget: int, *, swapped_only: bool) -> int:
        """Admit waiting requests first come first served while the strategy can place them and the budget
        allows (``swapped_only``: up to the first that is not swapped out); returns how many."""
        admitted, admitted_tokens = 0, 0
        accounting = self.accounting
        while self.waiting and len(self.running) < self.engine.max_num_seqs:
            head = self.waiting[0]
            if swapped_only and not head.swapped_slots:
                break
            if not self.admission.can_admit(self.allocator, head, head.num_prefill_tokens):
                break
            if self.engine.max_batched_tokens is not None:
                if budget - admitted_tokens <= 0:
                    break
            elif admitted_tokens and admitted_tokens + head.num_prefill_tokens > budget:
                break
            # Unchunked, the admitting step computes the whole prompt; chunked, only what swaps back in, and each
            # chunk is reported as it is scheduled.
            computed = None if self.engine.max_batched_tokens is None else \
                head.num_computed if head.swapped_slots else 0
            loaded = 0
            if self.tiers is not None and self.keyed and not head.swapped_slots:
                hits = self.allocator.cached_prefix(head, head.num_prefill_tokens)
                loaded, ready = self.tiers.load(head.block_hashes, hits, head.num_prefill_tokens, self.forward_start,
                                                count_hits=not head.queried)
                if loaded:  # the step's forward waits for it (v0 had no asynchronous connector)
                    self.forward_start = ready
                    computed = None if computed is None else hits + loaded
            cached = self.admission.admit(self.allocator, head, head.num_prefill_tokens, computed)
            self.running.append(self._dequeue())
            if head.swapped_slots:  # swap in: its KV comes back, except blocks the prefix cache still holds
                moved = max(head.swapped_slots - cached, 0)
                if self.tiers is not None:
                    self.forward_start = self.tiers.swap_in(head.swapped_slots, moved, self.forward_start)
                self.cpu_used -= head.swapped_slots
                head.swapped_slots = 0
                accounting.swap_in_tokens += moved
                self.swapped_tokens += moved
            else:
                head.num_computed = cached + loaded
                if loaded:
                    self._note_loads(head, cached, cached + loaded)
                if self.keyed and not head.queried:  # a re-prefill is not a query (vLLM PR 25787)
                    head.queried = True
                    accounting.prefix_cache_queries += head.num_prefill_tokens
                    accounting.prefix_cache_hits += cached
                    head.num_cached_tokens = cached
            admitted_tokens += head.num_prefill_tokens - head.num_computed
            admitted += 1
        return admitted

    def _preempt(self, victim: LiveRequest) -> None:
        """Swap the victim's KV out to the CPU pool if it has room (it comes back on readmission), else
        recompute."""
        slots = self.allocator.swap_slots(victim, victim.num_computed)
        room = self.cpu_used + slots <= self.cpu_capacity if self.tiers is None else self.tiers.can_swap_out(slots)
        if self.engine.preemption != "swap" or not room:
            super()._preempt(victim)
            return
        self._drop(victim)
        if self.tiers is not None:
            self.forward_start = self.tiers.swap_out(slots, self.forward_start)
        self.cpu_used += slots
        victim.swapped_slots = slots
        self.accounting.num_swaps += 1
        self.accounting.swap_out_tokens += slots
        self.swapped_tokens += slots
        # readmission allocates for what it holds, and a victim caught mid-prefill resumes it
        victim.num_prefill_tokens = max(victim.num_prefill_tokens, victim.num_computed)
        self._enqueue(victim, front=True)

    def _reject(self, live: LiveRequest, reason: str) -> None:
        if self.tiers is not None and live.swapped_slots:
            self.tiers.release_swapped(live.swapped_slots)
        self.cpu_used -= live.swapped_slots
        live.swapped_slots = 0
        super()._reject(live, reason)
