"""The documentation's generated reference: every command's options from the Typer app (docs/reference/cli.md) and
the preset tables from configs/ (docs/reference/presets.md, between its ``<!-- generated -->`` markers).

    python scripts/reference_pages.py           # write them
    python scripts/reference_pages.py --check   # exit 1 when a committed page differs from what the code gives

``tests/project/test_docs.py`` runs the check, so an option added or changed without regenerating fails the tests."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
PRESETS_PAGE = ROOT / "docs" / "reference" / "presets.md"
BEGIN, END = "<!-- generated: scripts/reference_pages.py -->", "<!-- end generated -->"


def _click_command() -> Any:
    import typer

    from minipaged_cli.cli.main import app

    return typer.main.get_command(app)


def _cell(text: str) -> str:
    """Text for one table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _row(param: Any, ctx: Any) -> str:
    """One option or argument as a table row: its names and value, and its help with the default."""
    names, help_text = param.get_help_record(ctx) or (param.name, "")
    return f"| `{names}` | {_cell(help_text)} |"


def cli_page() -> str:
    """docs/reference/cli.md: a section per command, its options by help panel, its examples."""
    group = _click_command()
    root = group.context_class(group, info_name="minipaged")
    lines = ["# Command line", "",
             "Generated from the Typer app by `python scripts/reference_pages.py`; do not edit by hand. The",
             "[guide](../guide/index.md) has a page per command.", "",
             "```", f"minipaged {' '.join(group.collect_usage_pieces(root))}", "```", "",
             "| option | help |", "|---|---|"]
    lines += [_row(param, root) for param in group.get_params(root) if not param.hidden]
    lines.append("")
    for name in group.list_commands(root):
        command = group.get_command(root, name)
        ctx = command.context_class(command, info_name=name, parent=root)
        lines += [f"## minipaged {name}", "", _cell(command.help or ""), "", "```",
                  f"minipaged {name} {' '.join(command.collect_usage_pieces(ctx))}", "```", ""]
        panels: dict[str, list[str]] = {}
        for param in command.get_params(ctx):
            if param.hidden:
                continue
            panel = "Arguments" if param.param_type_name == "argument" else \
                getattr(param, "rich_help_panel", None) or "Options"
            panels.setdefault(panel, []).append(_row(param, ctx))
        for panel, rows in panels.items():
            lines += [f"**{panel}**", "", "| option | help |", "|---|---|", *rows, ""]
        if command.epilog:
            examples = [" ".join(example.split()) for example in command.epilog.split("\n\n")]
            lines += ["Examples:", "", "```bash", *(e for e in examples if e.startswith("minipaged")), "```", ""]
    return "\n".join(lines)


def presets_table() -> str:
    """The model and GPU presets, as the simulator reads them."""
    from minipaged_cli.workloads.presets import load_gpu, load_model, preset_names

    rows = ["| model | layers | q / kv heads | head dim | attention | params (active) | weights GB "
            "| KV bytes a token |", "|---|---:|---:|---:|---|---:|---:|---:|"]
    for name in preset_names("models"):
        spec = load_model(name)
        if spec.is_mla:
            attention = "MLA"
        elif spec.is_hybrid:
            full = spec.num_layers - spec.num_sliding_layers
            attention = f"{spec.num_sliding_layers} sliding ({spec.sliding_window}) + {full} full"
        else:
            attention = "full"
        active = f" ({spec.num_active_params / 1e9:.2f} B)" if spec.is_moe else ""
        rows.append(f"| `{name}` | {spec.num_layers} | {spec.num_q_heads} / {spec.num_kv_heads} | {spec.head_dim} | "
                    f"{attention} | {spec.num_params / 1e9:.1f} B{active} | {spec.weight_bytes / 1e9:.1f} | "
                    f"{spec.kv_bytes_per_token:,} |")
    rows += ["", "| GPU | memory GiB | HBM TB/s | peak TFLOP/s | host link GB/s |", "|---|---:|---:|---:|---:|"]
    for name in preset_names("gpus"):
        gpu = load_gpu(name)
        rows.append(f"| `{name}` | {gpu.memory_bytes / 2**30:.0f} | {gpu.hbm_bandwidth_bytes_per_s / 1e12:.2f} | "
                    f"{gpu.peak_flops / 1e12:.0f} | {gpu.host_bandwidth_bytes_per_s / 1e9:.0f} |")
    return "\n".join(rows)


def presets_page(current: str) -> str:
    """presets.md with its generated region replaced."""
    head, rest = current.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{presets_table()}\n{END}{tail}"


def pages() -> dict[Path, str]:
    """Every generated page: path -> the text the code gives now."""
    return {CLI_PAGE: cli_page() + "\n", PRESETS_PAGE: presets_page(PRESETS_PAGE.read_text())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed page is out of date")
    args = parser.parse_args()
    stale = []
    for path, text in pages().items():
        old = path.read_text() if path.exists() else None
        if old != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
                print(f"wrote {path.relative_to(ROOT)}")
    if args.check and stale:
        print("out of date (run python scripts/reference_pages.py): "
              + ", ".join(str(p.relative_to(ROOT)) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
