"""The agent-loop generator: a ``generate:`` group with ``steps`` makes agent tasks, each a session.

A task starts with a model call on its prompt; each later step sends the tool results back after the tools'
latency and calls the model again, on the whole history. A step may fan out into ``parallel`` model calls (sub-agents,
parallel branches), each on the history plus its own tool result; the next call joins them all (fan-in), its prompt
holding every branch's input and output in order.

```yaml
generate:
  - count: 50
    seed: 1
    arrival: {process: poisson, rate_per_s: 0.5}
    prefix: [system, tool-schemas]                  # shared segments every call begins with
    prompt_tokens: {dist: lognormal, median: 300, sigma: 0.5}   # the task
    steps: {dist: uniform, low: 3, high: 10}        # model calls on the main path
    parallel: {dist: uniform, low: 1, high: 3}      # calls a step fans out into (1: no fan-out)
    output_tokens: {dist: uniform, low: 20, high: 200}          # each call's tool calls or answer
    tool_result_tokens: {dist: lognormal, median: 400, sigma: 1.0}
    tool_latency_s: {dist: lognormal, median: 0.5, sigma: 0.8}
```
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipaged_cli.validation import MAX_REQUESTS
from minipaged_cli.workloads.fields import Fields, read_group, sample_lengths, sample_seconds
from minipaged_cli.workloads.sessions import Session, Turn

AGENT_GROUP_KEYS = {"count", "seed", "arrival", "id_prefix", "prefix", "prompt_tokens", "steps", "parallel",
                    "output_tokens", "tool_result_tokens", "tool_latency_s"}


def generate_agent_tasks(group: dict[str, Any], index: int, source: str) -> list[Session]:
    head = read_group(group, index, source, AGENT_GROUP_KEYS, "agent")
    reader, where, count, rng, starts = head.reader, head.where, head.count, head.rng, head.arrivals

    def lengths(key: str, size: int, default: dict[str, Any] | None = None) -> np.ndarray:
        spec = reader.mapping(group, key) if default is None or key in group else default
        return sample_lengths(spec, size, rng, Fields(source, f"{where}.{key}"))

    prompts = lengths("prompt_tokens", count)
    steps = lengths("steps", count)
    if int(steps.sum()) > MAX_REQUESTS:
        raise reader.error(f"the tasks hold more than {MAX_REQUESTS} steps", "steps", group["steps"])
    prefix = reader.prefix(group)
    tasks = []
    for number in range(count):
        num_steps = int(steps[number])
        fan_out = lengths("parallel", num_steps, {"dist": "constant", "value": 1})
        calls = int(fan_out[1:].sum()) + 1 + int((fan_out[1:] > 1).sum())  # (a fan-out adds its join call)
        if calls > MAX_REQUESTS:
            raise reader.error(f"a task makes {calls} calls, more than {MAX_REQUESTS}", "parallel", group["parallel"])
        outputs = lengths("output_tokens", calls)
        results = lengths("tool_result_tokens", calls)
        latencies = sample_seconds(reader.mapping(group, "tool_latency_s"), calls, rng,
                                   Fields(source, f"{where}.tool_latency_s")) if "tool_latency_s" in group \
            else np.zeros(calls)
        turns = [Turn(int(prompts[number]), int(outputs[0]))]
        last: tuple[int, ...] = (0,)
        for step in range(1, num_steps):
            width = int(fan_out[step])
            if width > 1:
                first = len(turns)
                turns += [_call(results, outputs, latencies, len(turns) + j, last) for j in range(width)]
                last = tuple(range(first, first + width))
            turns.append(_call(results, outputs, latencies if width == 1 else np.zeros(calls), len(turns), last))
            last = (len(turns) - 1,)
        tasks.append(Session(f"{head.id_prefix}{number}", tuple(turns), start_s=float(starts[number]), prefix=prefix))
    return tasks


def _call(results: np.ndarray, outputs: np.ndarray, latencies: np.ndarray, call: int, after: tuple[int, ...]) -> Turn:
    """Model call number ``call``: the tool result as its new input, sent after the tool's latency."""
    return Turn(int(results[call]), int(outputs[call]), delay_s=float(latencies[call]), after=after)
