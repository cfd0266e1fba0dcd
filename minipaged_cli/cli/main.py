"""The ``minipaged`` command: one Typer app, one module per command beside this one."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from minipaged_cli import __version__
from minipaged_cli.cli.common import stderr
from minipaged_cli.cli.grammar import assign_panels, renamed
from minipaged_cli.cli.settings import name_the_file, print_settings, settings_params
from minipaged_cli.cli.startup import lasting, one_blas_thread

try:
    from minipaged_cli.cli.option_values import convert_plainly
except ImportError:  # a Typer before 0.29 converts with click's types, which need no pydantic

    def convert_plainly(params: list[Any]) -> list[Any]:
        return params

# Click's UsageError, whether Typer vendors click (0.2x) or imports it: the base of the BadParameter it exports.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _flags_untyped(params: list[Any]) -> list[Any]:
    """Typer 0.29 shows every flag (--help too) with a ``<bool>`` type, as if it took a value, which it refuses
    (``--prefix-caching true``): a flag shows no type."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class _Command(TyperCommand):
    """A command with the options every command shares (``--config``, ``--print-config``: ``settings.py``) and its
    options under their help panels (``grammar.py``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        own = {param.name for param in self.params}
        self.params += [param for param in settings_params() if param.name not in own]  # sweep reads its own file

    def get_params(self, ctx: Any) -> list[Any]:
        return assign_panels(convert_plainly(_flags_untyped(super().get_params(ctx))))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except typer.BadParameter as error:
            name_the_file(error, ctx)
            raise

    def invoke(self, ctx: Any) -> Any:
        if ctx.meta.get("minipaged.print_config"):
            print_settings(ctx)
            return None
        return super().invoke(ctx)


# Each command, in the order help lists them: its line in the group's help. The command ``NAME`` is
# ``NAME_command`` in the module ``cli/NAME.py``, with that module's ``EPILOG`` (its examples).
COMMANDS = {
    "simulate": "Paged vs contiguous KV allocation on a trace: where memory goes.",
    "sweep": "Latency against request rate for every strategy; the rate each sustains.",
    "run": "The paged replay on real K/V tensors: cache writes and decode attention.",
    "verify": "Qwen3 attention through the paged cache against Hugging Face.",
    "profile": "Which block size? The trade-off on a trace, measured.",
    "calibrate": "Step times measured on your GPU, for simulate --calibration.",
    "convert": "A public trace, or a slice of it, to the YAML trace format.",
}


def _command(name: str) -> Any:
    """The command ``name``, built as Typer builds a group's commands (its module imported here, not before)."""
    one_blas_thread(name)
    with lasting():
        module = importlib.import_module(f"minipaged_cli.cli.{name}")
    one = typer.Typer(rich_markup_mode="markdown", add_completion=False, pretty_exceptions_enable=False)
    one.command(cls=_Command, name=name, epilog=module.EPILOG, short_help=COMMANDS[name])(
        getattr(module, f"{name}_command"))
    return typer.main.get_command(one)


class _LazyCommands(MutableMapping[str, Any]):
    """The group's commands by name, each built the first time it is asked for: Typer builds every option of
    every command it holds, so a run of one command would otherwise import the modules of all (and their libraries).

    Invariant: iterating yields every name, in ``COMMANDS``' order, without building any."""

    def __init__(self, build: Callable[[str], Any], names: Iterable[str]) -> None:
        self._build = build
        self._names = list(names)
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in self._names:
                raise KeyError(name)
            self._built[name] = self._build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self._names:
            self._names.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def listing(self, short_help: Mapping[str, str]) -> dict[str, Any]:
        """Every command by name, in order, as the group's help lists it: one not built yet is a stand-in that holds
        its name and its line of ``short_help`` alone."""
        return {name: self._built.get(name) or TyperCommand(name=name, callback=None, short_help=short_help[name])
                for name in self._names}


class _OneLineUsageErrors(TyperGroup):
    """Usage errors (a missing argument, a value of the wrong type) as one line on stderr and exit code 2,
    like the errors the commands raise themselves, instead of Typer's usage-and-panel block; the commands of
    ``COMMANDS``, each built when asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(_command, COMMANDS)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names alone: Typer's lists its items, which would build every command

    def get_params(self, ctx: Any) -> list[Any]:
        return convert_plainly(_flags_untyped(super().get_params(ctx)))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The group's help, which lists the commands by their lines of ``COMMANDS`` without building them (that
        would import every command's module, NumPy and the data plane's libraries with them)."""
        commands = self.commands
        self.commands = commands.listing(COMMANDS)
        try:
            super().format_help(ctx, formatter)
        finally:
            self.commands = commands

    def main(self, args: list[str] | None = None, *rest: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        args = renamed(_optional_values(list(sys.argv[1:] if args is None else args)))
        try:
            result = super().main(args, *rest, standalone_mode=False, **kwargs)
        except _UsageError as error:
            if not standalone_mode:
                raise
            if type(error).__name__ != "NoArgsIsHelpError":  # the help was printed instead
                command = error.ctx.command_path if error.ctx is not None else "minipaged"
                stderr.print(f"error: {error.format_message()} (see '{command} --help')", markup=False,
                             highlight=False, soft_wrap=True)
            sys.exit(error.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            stderr.print("aborted", markup=False)
            sys.exit(1)
        if not standalone_mode:
            return result
        # Without standalone mode, click returns the code of typer.Exit instead of exiting with it.
        sys.exit(result if isinstance(result, int) else 0)

# Options whose value may be left out (click has no such option without a deprecated Typer flag): the value used then.
OPTIONAL_VALUES = {"--ray": "auto"}


def _optional_values(args: list[str]) -> list[str]:
    """``--ray`` at the end or before another option means ``--ray auto``."""
    out: list[str] = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg in OPTIONAL_VALUES and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(OPTIONAL_VALUES[arg])
    return out


app = typer.Typer(
    name="minipaged",
    cls=_OneLineUsageErrors,
    help="Paged KV-cache memory management for LLM inference: see what paging saves on real request traces.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


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
