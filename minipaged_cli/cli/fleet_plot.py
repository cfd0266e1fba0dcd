"""``simulate --replicas N --plot``: requests (waiting or running) and KV usage of each replica over time."""

from __future__ import annotations

from pathlib import Path

from minipaged_cli.cli.plot import _save
from minipaged_cli.fleet.fleet import FleetResult


def plot_fleet_timeline(result: FleetResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (requests, usage) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    for replica in result.replicas:
        times = [t for t, _, _ in replica.timeline or []]
        requests.step(times, [n for _, n, _ in replica.timeline or []], where="post", label=f"{replica.index}",
                      linewidth=0.8)
        usage.step(times, [u for _, _, u in replica.timeline or []], where="post", linewidth=0.8)
    requests.set_ylabel("requests (waiting + running)")
    usage.set_ylabel("KV usage %")
    usage.set_xlabel("time (s)")
    requests.legend(title="replica", fontsize="small", ncol=4)
    figure.tight_layout()
    _save(figure, path, plt)
