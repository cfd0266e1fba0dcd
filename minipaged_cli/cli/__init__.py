"""The command line: the Typer app (``main``), one module per command, and the one place that formats output
(``render``, ``plot``). Commands parse options, call the library, and print what it returns."""

from minipaged_cli.cli.startup import lasting

with lasting():
    from minipaged_cli.cli.main import app, main

__all__ = ["app", "main"]
