"""The ``minipaged`` command: one Typer app, one module per command under ``commands/``."""

from __future__ import annotations

import typer

from minipaged_cli import __version__
from minipaged_cli.commands import convert, simulate

app = typer.Typer(
    name="minipaged",
    help="Paged KV-cache memory management for LLM inference: see what paging saves on real request traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("simulate", epilog=simulate.EPILOG)(simulate.simulate_command)
app.command("convert", epilog=convert.EPILOG)(convert.convert_command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"minipaged {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Paged KV-cache memory management for LLM inference: see what paging saves on real request traces."""


def main() -> None:
    app()
