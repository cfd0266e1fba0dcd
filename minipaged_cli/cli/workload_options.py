"""How a workload is read (``--tokenizer``, for the formats that hold text) and how its requests reach the engine
(the clients, ``sim/clients.py``): options shared by ``simulate``, ``convert`` and ``sweep``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from minipaged_cli.errors import InputError
from minipaged_cli.sim.clients import CLIENT_KINDS, Clients

TokenizerOpt = Annotated[Path | None, typer.Option(
    "--tokenizer", help="A local tokenizer directory (a model's, with tokenizer.json) that counts the tokens of "
                        "formats holding text (AIPerf, ShareGPT); needs transformers, downloads nothing. Default: "
                        "4 characters a token.", metavar="DIR", show_default=False)]
ClientsOpt = Annotated[str | None, typer.Option(
    "--clients", help="How requests are sent: open (at the trace's times; the default), closed (--concurrency "
                      "clients, each sending its next session or request when the last is done) or capped (open, "
                      "at most --max-concurrency in flight). Think times inside sessions always apply.",
    show_default=False)]
ConcurrencyOpt = Annotated[int | None, typer.Option(
    "--concurrency", help="Closed loop: this many clients (AIPerf's and genai-perf's --concurrency).",
    show_default=False)]
MaxConcurrencyOpt = Annotated[int | None, typer.Option(
    "--max-concurrency", help="Open loop with at most this many requests in flight (vllm bench serve's); the "
                              "wait in the client is reported beside TTFT.", show_default=False)]


def clients_option(kind: str | None, concurrency: int | None, max_concurrency: int | None) -> Clients:
    """The clients the three options describe; ``--clients`` may be left out, or must agree with the others."""
    clients = Clients(concurrency=concurrency, max_concurrency=max_concurrency)
    if kind is not None and kind not in CLIENT_KINDS:
        raise InputError(f"expected one of {', '.join(CLIENT_KINDS)}", field="--clients", value=kind, has_value=True)
    if kind is not None and kind != clients.kind:
        needs = {"open": "neither --concurrency nor --max-concurrency", "closed": "--concurrency N",
                 "capped": "--max-concurrency N"}[kind]
        raise InputError(f"{kind} clients take {needs}", field="--clients", value=kind, has_value=True)
    return clients
SweepConcurrencyOpt = Annotated[str | None, typer.Option(
    "--concurrency", help="Closed-loop clients, comma-separated (1,8,32): an axis of the sweep, each value a closed "
                          "loop of that many clients (one replay: arrival times are not used; --rates defaults to "
                          "one rate then).", show_default=False)]
