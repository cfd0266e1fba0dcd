"""The command line: exit codes, one-line errors, JSON keys, plots, and a start-up that imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from minipaged_cli.cli.main import COMMANDS, app
from tests.conftest import ROOT

runner = CliRunner()
MIXED = str(ROOT / "traces" / "mixed.yaml")
STRATEGY_KEYS = {"token_state_pct", "reserved_future_pct", "internal_frag_pct", "external_frag_pct", "free_pct",
                 "averaged_over", "kv_cache_usage_perc", "completed_requests", "rejected_requests",
                 "num_preemptions", "mean_batch_size", "max_batch_size", "throughput_tokens_per_s", "makespan_s",
                 "mean_ttft_s", "p99_ttft_s", "mean_tpot_s", "mean_normalized_latency_s", "p99_normalized_latency_s",
                 "invariant_violations", "rejection_reasons", "kv_cache_usage_peak_perc", "mean_e2e_s", "p99_e2e_s",
                 "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_pct", "num_evictions",
                 "num_copy_on_writes", "num_swaps", "swap_out_bytes", "swap_in_bytes"}


def test_simulate_mixed_prints_a_row_per_strategy() -> None:
    result = runner.invoke(app, ["simulate", MIXED])
    assert result.exit_code == 0, result.output
    for name in ("paged", "max-reserve", "pow2-reserve", "oracle-reserve", "dynamic"):
        assert name in result.output
    assert "token states" in result.output


def test_json_to_stdout_has_the_documented_keys_and_the_printed_numbers(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", MIXED, "--json", "-", "--kv-memory", "64GiB", "--block-size", "16",
                                 "--strategies", "paged,oracle-reserve"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document["trace"]) == {"name", "num_requests", "prompt_tokens", "output_tokens"}
    assert set(document["config"]) == {"model", "gpu", "block_size", "num_blocks", "kv_capacity_tokens",
                                       "kv_cache_dtype", "kv_bytes_per_token", "max_model_len", "prefix_caching",
                                       "preemption", "cpu_blocks", "watermark", "calibration", "scheduler",
                                       "max_num_seqs", "max_batched_tokens", "long_prefill_token_threshold",
                                       "vllm_version", "kv_size_tokens", "max_concurrency", "kv_sizing"}
    assert document["config"]["kv_sizing"] is None  # --kv-memory is exact: nothing sized
    assert document["config"]["kv_bytes_per_token"] == 2 * 36 * 8 * 128 * 2  # qwen3-8b, bf16
    assert document["config"]["num_blocks"] == 64 * 2**30 // (16 * 147456)
    assert list(document["strategies"]) == ["paged", "oracle-reserve"]
    for metrics in document["strategies"].values():
        assert set(metrics) == STRATEGY_KEYS
    # the same numbers in the table (printed to stderr when the JSON takes stdout)
    paged = document["strategies"]["paged"]
    assert f"{paged['token_state_pct']:.1f}" in result.stderr

    path = tmp_path / "out.json"
    result = runner.invoke(app, ["simulate", MIXED, "--json", str(path), "--kv-memory", "64GiB", "--block-size",
                                 "16", "--strategies", "paged,oracle-reserve"])
    assert result.exit_code == 0
    assert json.loads(path.read_text())["strategies"]["paged"] == paged


def test_prefix_caching_parallel_sampling_and_swap_from_the_command_line(tmp_path: Path) -> None:
    trace = tmp_path / "shared.yaml"
    trace.write_text("segments: {system: 512}\n"
                     "generate:\n"
                     "  - {count: 40, seed: 1, prefix: [system], n: 2, arrival: {process: poisson, rate_per_s: 50},\n"
                     "     prompt_tokens: {dist: uniform, low: 600, high: 900},\n"
                     "     output_tokens: {dist: uniform, low: 50, high: 200}}\n")
    # v0's scheduling: swap and forked samples (copy-on-write) are v0's
    result = runner.invoke(app, ["simulate", str(trace), "--prefix-caching", "--preemption", "swap", "--cpu-blocks",
                                 "500", "--watermark", "0.01", "--num-blocks", "600", "--max-model-len", "2048",
                                 "--scheduler", "v0", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["config"]["prefix_caching"] and document["config"]["preemption"] == "swap"
    paged = document["strategies"]["paged"]
    # 40 prompts each begin with the 512-token segment: all but the first find its 32 blocks cached
    assert paged["prefix_cache_hits"] == 39 * 512
    assert paged["num_copy_on_writes"] > 0  # the second sample of each request copies the prompt's last block
    assert document["strategies"]["oracle-reserve"]["prefix_cache_queries"] == 0  # paged only
    assert "Sharing, preemption and rejections" in result.stderr
    assert f"{paged['prefix_cache_hits']:,} / {paged['prefix_cache_queries']:,}" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--preemption", "swop"], "error: --preemption: 'swop': expected one of recompute, swap"),
    (["--preemption", "swap", "--scheduler", "v0"],
     "error: --cpu-blocks: 0: swap needs a CPU pool; set --cpu-blocks or --cpu-kv-memory"),
    (["--watermark", "1.5"], "error: --watermark: 1.5: must be in [0, 1)"),
])
def test_sharing_options_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["simulate", MIXED, *args])
    assert result.exit_code == 2
    assert result.stderr.strip() == message


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "memory.png"
    result = runner.invoke(app, ["simulate", MIXED, "--plot", str(path), "--strategies", "paged,max-reserve"])
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_check_invariants_reports_none_on_mixed() -> None:
    result = runner.invoke(app, ["simulate", MIXED, "--check-invariants", "--json", "-"])
    assert result.exit_code == 0
    assert all(m["invariant_violations"] == 0 for m in json.loads(result.stdout)["strategies"].values())


@pytest.mark.parametrize(("args", "needle"), [
    (["simulate", "no/such/trace.yaml"], "no/such/trace.yaml: no such file"),
    (["simulate", MIXED, "--model", "qwen3-8"], "did you mean 'qwen3-8b'"),
    (["simulate", MIXED, "--kv-memory", "12 furlongs"], "--kv-memory: '12 furlongs'"),
    (["simulate", MIXED, "--kv-memory", "1GiB", "--num-blocks", "10"], "not both"),
    (["simulate", MIXED, "--strategies", "paged,orcale-reserve"], "did you mean 'oracle-reserve'"),
    (["simulate", MIXED, "--num-blocks", "10"], "too small for any request"),
    (["simulate", MIXED, "--max-model-len", "10"], "--max-model-len: 10"),
    (["simulate", MIXED, "--trace-format", "csv"], "--trace-format: 'csv'"),
    (["simulate", MIXED, "--block-size", "0"], "--block-size: 0"),
    (["simulate", MIXED, "--json", "/no/such/dir/out.json"], "--json: '/no/such/dir/out.json': no such directory"),
    (["simulate", MIXED, "--plot", "/no/such/dir/out.png"], "--plot: '/no/such/dir/out.png': no such directory"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert needle in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "needle"), [
    (["simulate", MIXED, "--block-size", "abc"], "--block-size"),
    (["simulate"], "TRACE: give a request trace"),
    (["simulate", MIXED, "--bogus"], "No such option: --bogus"),
])
def test_usage_errors_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_bad_trace_file_names_file_request_field_value(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("requests:\n  - {id: q1, arrival_s: 0, prompt_tokens: -3, output_tokens: 4}\n")
    result = runner.invoke(app, ["simulate", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {path}: requests[0] (id q1): prompt_tokens: -3: must be >= 1"


def test_internal_error_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    import minipaged_cli.cli.simulate as command

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(command, "simulate", broken)
    result = runner.invoke(app, ["simulate", MIXED])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("internal error: ZeroDivisionError: boom")


def test_convert_round_trips_a_slice(tmp_path: Path) -> None:
    out = tmp_path / "slice.yaml"
    result = runner.invoke(app, ["convert", str(ROOT / "traces" / "azure_conv_1k.yaml"), str(out), "--limit", "5",
                                 "--note", "test note"])
    assert result.exit_code == 0, result.output
    assert "test note" in out.read_text()
    again = runner.invoke(app, ["simulate", str(out), "--json", "-"])
    assert json.loads(again.stdout)["trace"]["num_requests"] == 5


def test_help_has_examples() -> None:
    result = runner.invoke(app, ["simulate", "--help"])
    assert result.exit_code == 0
    assert "minipaged simulate traces/mixed.yaml" in result.output


def test_start_up_imports_neither_torch_nor_transformers() -> None:
    code = ("import sys; from minipaged_cli.cli.main import app; "
            "print('torch' in sys.modules, 'transformers' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False"]


def test_console_script_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "minipaged_cli", "simulate", MIXED, "--strategies", "paged",
                             "--json", "-"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["strategies"]["paged"]["completed_requests"] == 100


def test_progress_bar_appears_only_after_the_delay() -> None:
    from io import StringIO

    from rich.console import Console

    from minipaged_cli.cli.render import ReplayProgress

    console = Console(file=StringIO(), force_terminal=True)
    with ReplayProgress(console, 1000, ("paged", "dynamic"), delay_s=3600) as slow:
        for done in range(1000):
            slow("paged", done)
    assert slow.bar is None
    with ReplayProgress(console, 1000, ("paged", "dynamic"), delay_s=0) as fast:
        fast("dynamic", 10)
        assert fast.bar is not None
        assert fast.bar.tasks[0].completed == 1010  # dynamic is the second strategy
        assert fast.bar.tasks[0].total == 2000


def test_progress_bar_names_its_unit_and_stays_off_a_pipe() -> None:
    from io import StringIO

    from rich.console import Console

    from minipaged_cli.cli.render import ReplayProgress

    terminal = Console(file=StringIO(), force_terminal=True, no_color=True, width=120)
    with ReplayProgress(terminal, 1000, ("paged",), delay_s=0) as progress:
        progress("paged", 10)
        progress.bar.refresh()  # type: ignore[union-attr]
    assert "replaying paged" in terminal.file.getvalue() and "10/1000 requests" in terminal.file.getvalue()
    piped = Console(file=StringIO(), width=120)
    with ReplayProgress(piped, 1000, ("paged",), delay_s=0) as progress:
        progress("paged", 10)
    assert piped.file.getvalue() == ""  # a transient bar on a pipe would leave an empty line in the log


def test_progress_bar_asks_a_pipe_once_whether_it_is_a_terminal() -> None:
    from io import StringIO

    from rich.console import Console

    from minipaged_cli.cli.render import ReplayProgress

    class CountingConsole(Console):
        asked = 0

        @property
        def is_terminal(self) -> bool:
            CountingConsole.asked += 1
            return False

    # (the replay calls the bar at every event: a look at the stream each time cost 5 % of a long replay)
    piped = CountingConsole(file=StringIO())
    CountingConsole.asked = 0  # (Rich asks while it builds the console)
    with ReplayProgress(piped, 1000, ("paged",), delay_s=0) as progress:
        for done in range(1000):
            progress("paged", done)
    assert progress.bar is None and CountingConsole.asked == 1


def test_a_replay_off_a_terminal_is_given_no_progress_to_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from io import StringIO

    from rich.console import Console

    from minipaged_cli.cli import simulate as simulate_module
    from minipaged_cli.cli.render import ReplayProgress

    with ReplayProgress(Console(file=StringIO(), force_terminal=True), 10, ("paged",), delay_s=0) as progress:
        assert progress.for_replay() is progress
    with ReplayProgress(Console(file=StringIO()), 10, ("paged",), delay_s=0) as progress:
        assert progress.for_replay() is None
        progress("paged", 5)  # (called anyway: still no bar)
        assert progress.bar is None
    # simulate under the test runner (its stderr no terminal) hands its replays none
    given = []
    replay = simulate_module.simulate
    monkeypatch.setattr(simulate_module, "simulate", lambda *args, progress: given.append(progress)
                        or replay(*args, progress=progress))
    result = runner.invoke(app, ["simulate", str(ROOT / "traces" / "burst.yaml"), "--strategies", "paged"])
    assert result.exit_code == 0, result.output
    assert given == [None]


def test_plots_of_run_and_profile(tmp_path: Path) -> None:
    burst = str(ROOT / "traces" / "burst.yaml")
    run_png, profile_png = tmp_path / "run.png", tmp_path / "profile.png"
    result = runner.invoke(app, ["run", burst, "--device", "cpu", "--kv-memory", "1GiB", "--max-steps", "5",
                                 "--num-layers", "1", "--plot", str(run_png)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["profile", burst, "--kv-memory", "1GiB", "--max-model-len", "4096", "--device",
                                 "none", "--block-size", "8", "--block-size", "16", "--plot", str(profile_png)])
    assert result.exit_code == 0, result.output
    for path in (run_png, profile_png):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_reads_a_mooncake_slice_with_an_explicit_format(tmp_path: Path) -> None:
    path = tmp_path / "trace.data"  # no telling extension: --trace-format says what it is
    path.write_text('{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}\n'
                    '{"timestamp": 500, "input_length": 600, "output_length": 9, "hash_ids": [0, 3]}\n')
    assert runner.invoke(app, ["simulate", str(path)]).exit_code == 2
    result = runner.invoke(app, ["simulate", str(path), "--trace-format", "mooncake", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["trace"] == {"name": "trace", "num_requests": 2, "prompt_tokens": 1700, "output_tokens": 14}


def test_convert_refuses_a_non_yaml_output(tmp_path: Path) -> None:
    result = runner.invoke(app, ["convert", MIXED, str(tmp_path / "out.csv")])
    assert result.exit_code == 2 and "must be a .yaml file" in result.stderr


def test_the_help_lists_the_commands_as_they_are_when_built(capsys: pytest.CaptureFixture[str]) -> None:
    """The group's help lists stand-ins of the commands (building one imports its module): the same text as the
    commands themselves give."""
    listed = typer.main.get_command(app)
    listed.main(["--help"], prog_name="minipaged", standalone_mode=False)
    listed_help = capsys.readouterr().out
    assert not listed.commands._built  # (the stand-ins: no command was built)
    built = typer.main.get_command(app)
    for name in COMMANDS:
        built.commands[name]  # builds it
    built.main(["--help"], prog_name="minipaged", standalone_mode=False)
    assert all(name in listed_help for name in COMMANDS)
    assert listed_help == capsys.readouterr().out
