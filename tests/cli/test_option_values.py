"""cli/option_values.py against Typer's own conversion (a pydantic ``TypeAdapter`` per option): for every value a
command line or a settings file can give, the same result, or the same error."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

coercion = pytest.importorskip("typer._coercion", reason="a Typer before 0.29 converts without pydantic")

from minipaged_cli.cli.option_values import PlainValue, convert_plainly  # noqa: E402


def _options(
    text: Annotated[str, typer.Option()] = "auto",
    count: Annotated[int | None, typer.Option()] = None,
    positive: Annotated[int, typer.Option(min=1)] = 1,
    fraction: Annotated[float, typer.Option()] = 0.5,
    path: Annotated[Path | None, typer.Option()] = None,
    existing: Annotated[Path | None, typer.Option(exists=True)] = None,
    switch: Annotated[bool | None, typer.Option("--switch/--no-switch")] = None,
) -> None:
    """One option of each plain type simulate declares, an int with a range, a path that must exist (its error
    message names the path as given)."""


def _params() -> tuple[Any, dict[str, Any]]:
    app = typer.Typer()
    app.command()(_options)
    command = typer.main.get_command(app)
    return command.make_context("options", []), {param.name: param for param in command.params}


CTX, PARAMS = _params()

# Text near the numbers: signs, spaces, underscores, exponents, a dot, a non-ASCII digit, words pydantic reads.
NUMBER_TEXT = st.one_of(
    st.text(alphabet="0123456789-+._eE x٣", max_size=12),
    st.from_regex(r"-?[0-9]{1,25}(\.[0-9]{0,25})?([eE][-+]?[0-9]{1,3})?", fullmatch=True),
    st.sampled_from(["inf", "-inf", "nan", "Infinity", "1e400", "-0", "00", "0x10", "true"]))
VALUES = st.one_of(NUMBER_TEXT, st.text(max_size=8), st.integers(), st.floats(), st.booleans(), st.none(),
                   st.sampled_from([".", "/", "a//b/", "./x", "-", "/tmp", "/etc/hostname", "/tmp//", "//tmp"]))


def _outcome(runtime: Any, name: str, value: Any) -> tuple[str, Any]:
    """What converting ``value`` gives: ("value", its type and repr) or ("error", its type and message)."""
    try:
        result = runtime.coerce(value, param=PARAMS[name], ctx=CTX)
    except typer.BadParameter as error:
        return "error", error.format_message()
    if isinstance(result, float) and math.isnan(result):
        return "value", (float, "nan")
    return "value", (type(result), repr(result))  # repr: -0.0 is not 0.0


@settings(max_examples=600)
@given(name=st.sampled_from(sorted(PARAMS)), value=VALUES)
def test_plain_values_convert_as_typer_converts_them(name: str, value: Any) -> None:
    descriptor = PARAMS[name].type_descriptor
    typer_own = coercion.build_runtime_param(descriptor)
    plain = PlainValue(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation,
                       descriptor=descriptor)
    assert _outcome(plain, name, value) == _outcome(typer_own, name, value)


@pytest.mark.parametrize(("name", "value"), [("text", "qwen3-8b"), ("count", "128"), ("count", 7), ("positive", "3"),
                                             ("fraction", "0.9"), ("fraction", 1), ("path", "traces/mixed.yaml")])
def test_a_plain_value_needs_no_adapter(name: str, value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The values a command line usually gives are converted without Typer's pydantic adapter."""
    descriptor = PARAMS[name].type_descriptor
    plain = PlainValue(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation,
                       descriptor=descriptor)

    def no_adapter(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("built a pydantic adapter")

    monkeypatch.setattr("minipaged_cli.cli.option_values.build_runtime_param", no_adapter)
    assert plain.coerce(value, param=PARAMS[name], ctx=CTX) is not None


def test_every_param_of_a_plain_type_converts_plainly() -> None:
    app = typer.Typer()
    app.command()(_options)
    params = typer.main.get_command(app).params
    convert_plainly(params)
    assert {param.name for param in params if isinstance(param._runtime_param, PlainValue)} == set(PARAMS)


def test_a_typer_whose_internals_moved_keeps_its_own_conversion() -> None:
    # ``convert_plainly`` reaches into Typer 0.29's private ``_runtime_param``: a parameter without it (another
    # Typer) is left as Typer built it, and so are the rest, rather than the command line failing.
    class Moved:
        type_descriptor = typer.main.get_command(_app()).params[0].type_descriptor

    app_params = typer.main.get_command(_app()).params
    params = [Moved(), *app_params]
    assert convert_plainly(params) is params
    assert not hasattr(params[0], "_runtime_param")
    assert not any(isinstance(param._runtime_param, PlainValue) for param in app_params)


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(_options)
    return app
