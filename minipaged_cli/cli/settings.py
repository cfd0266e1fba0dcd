"""Settings files for every command: ``--config FILE`` (a YAML mapping of the command's option names, the trace as
``trace``) gives defaults that the command line overrides, and ``--print-config`` writes the settings a command
would run with as such a file, then exits.

The file becomes click's ``default_map`` before any other option is parsed, so every value in it is converted and
checked exactly as the same value on the command line would be. ``sweep`` reads its own ``--config`` (with the
same keys, and lists as YAML lists: ``sweep_options.py``); only ``--print-config`` comes from here for it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from minipaged_cli.workloads.presets import read_config_file


def read_settings_file(path: Path) -> dict[str, Any]:
    """The mapping a settings file holds; ValueError naming the file when it is not one."""
    try:
        data = read_config_file(path)
    except Exception as error:  # InputError: unreadable, not YAML
        raise ValueError(str(error)) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of option names to values")
    return data


# ctx.meta's key for the settings a --config file gave: parameter name -> "FILE: key: value".
FROM_FILE = "minipaged.settings_file"


def _key(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def _names(ctx: Any) -> dict[str, Any]:
    """Every key a settings file may use for this command -> its parameter."""
    names = {}
    for param in ctx.command.params:
        if param.name in ("config", "print_config"):
            continue
        names[param.name] = param
        for opt in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
            if opt.startswith("--") and not opt.startswith("--no-"):
                names[_key(opt)] = param
        if param.param_type_name == "argument":
            names[_key(param.name.removesuffix("_path"))] = param
    return names


def _as_option_value(param: Any, value: Any) -> Any:
    """A YAML value as the command line would give it: lists comma-separated unless the option repeats."""
    if isinstance(value, dict):
        value = [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, list | tuple) and not getattr(param, "multiple", False):
        return ",".join(str(v) for v in value)
    return value


def load_settings(ctx: Any, param: Any, value: Path | None) -> Path | None:
    """``--config FILE``: the file's settings become the command's defaults (the command line still wins)."""
    if value is None or ctx.resilient_parsing:
        return value
    try:
        data = read_settings_file(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    names = _names(ctx)
    defaults = {}
    for key, setting in data.items():
        target = names.get(_key(str(key)))
        if target is None:
            keys = sorted(_key(o).replace("_", "-") for p in ctx.command.params for o in getattr(p, "opts", [])
                          if o.startswith("--") and p.name not in ("config", "print_config"))
            raise typer.BadParameter(f"{value}: {key}: not an option of 'minipaged {ctx.info_name}'; expected trace "
                                     f"or some of {', '.join(keys)}")
        defaults[target.name] = _as_option_value(target, setting)
        ctx.meta.setdefault(FROM_FILE, {})[target.name] = f"{value}: {key}: {setting!r}"
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def name_the_file(error: Any, ctx: Any) -> None:
    """A value of a settings file that the option's type refuses: the message names the file, the key and the
    value (click's would name only the option)."""
    param = getattr(error, "param", None)
    source = ctx.get_parameter_source(param.name) if param is not None else None
    if source is not None and source.name == "DEFAULT_MAP" and param.name in ctx.meta.get(FROM_FILE, {}):
        error.param_hint = ctx.meta[FROM_FILE][param.name]


def note_print_config(ctx: Any, param: Any, value: bool) -> bool:
    if value:
        ctx.meta["minipaged.print_config"] = True
    return value


def print_settings(ctx: Any) -> None:
    """The settings the command would run with, as a settings file, on stdout."""
    settings: dict[str, Any] = {}
    by_name = {param.name: param for param in ctx.command.params}
    values = dict(ctx.params)
    own_file = values.get("config") if "config" in by_name and by_name["config"].expose_value else None
    if own_file is not None:  # sweep: its --config file, under what the command line gave
        from minipaged_cli.cli.sweep_options import read_config

        for key, setting in read_config(Path(own_file)).items():
            if ctx.get_parameter_source(key) is None or ctx.get_parameter_source(key).name != "COMMANDLINE":
                values[key] = setting
    for name, param in by_name.items():  # (in the order the command declares them)
        value = values.get(name)
        if name in ("config", "print_config") or value is None or value == ():
            continue
        long = [opt for opt in getattr(param, "opts", []) if opt.startswith("--")]
        key = long[0].removeprefix("--") if long else name.removesuffix("_path")
        settings[key] = _plain(value)
    sys.stdout.write(yaml.safe_dump(settings, sort_keys=False, allow_unicode=True))


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def settings_params() -> list[Any]:
    """``--config`` and ``--print-config`` as Typer builds options, for a command to add to its own."""

    def options(
        config: Annotated[Path | None, typer.Option(
            "--config", metavar="YAML", is_eager=True, callback=load_settings, show_default=False,
            help="A YAML file of this command's settings, keyed by option name (kv-memory: 16GiB; trace: PATH); "
                 "the command line overrides it.")] = None,
        print_config: Annotated[bool, typer.Option(
            "--print-config", callback=note_print_config,
            help="Print the resolved settings as a --config file and exit.")] = False,
    ) -> None:
        """(the two options' definitions)"""

    app = typer.Typer(add_completion=False)
    app.command()(options)
    params = typer.main.get_command(app).params
    for param in params:
        param.expose_value = False
    return params
