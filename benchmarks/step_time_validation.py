"""The step-time model against measured GEMM times: Llama-2-7B's linear layers on an H100 and an A100 80GB
(microsoft/vidur's public profiles, ``tests/data/``), batch 1-128 decode and 512-4,096-token prefill.

Three predictions beside each measurement, per layer:

- roofline: ``max(FLOPs / peak, weight bytes / bandwidth)``, the datasheet's peaks (the simulator before issue 16);
- efficiency: the GPU preset's efficiency model (``sim/step_time.py``, efficiencies in ``configs/gpus/``);
- calibrated: interpolation in a calibration made from every other row of the profile, predicting the rows it
  left out (the shipped calibrations hold every row, so on the profile's own shapes they are exact).

Then the element-wise kernels the same profiles time (two RMSNorms, RoPE, SiLU, the residual add): measured
against the efficiency model's memory-bound term (fused kernels at the preset's attention bandwidth efficiency).

    python benchmarks/step_time_validation.py            # the summary and the README's table
    python benchmarks/step_time_validation.py --all      # every shape
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minipaged_cli.apps.vidur import from_vidur  # noqa: E402
from minipaged_cli.sim.calibration import Calibration, Table  # noqa: E402
from minipaged_cli.sim.step_time import StepTimeModel  # noqa: E402
from minipaged_cli.workloads.presets import load_gpu, load_model  # noqa: E402

PROFILES = {"h100": ROOT / "tests/data/vidur_h100_llama-2-7b_mlp.csv",
            "a100-80gb": ROOT / "tests/data/vidur_a100-80gb_llama-2-7b_mlp.csv"}
SHOWN = (1, 8, 32, 64, 128, 512, 1024, 2048, 4096)
RANGES = {"decode 1-128": (1, 128), "prefill 512-4096": (512, 4096)}


def predictions(gpu_name: str) -> dict[str, np.ndarray]:
    """Per-layer seconds of the linear layers at every profiled token count: measured and predicted."""
    model, gpu = load_model("llama-2-7b"), load_gpu(gpu_name)
    profile = from_vidur(PROFILES[gpu_name], model, gpu_name).linear
    assert profile is not None
    tokens, measured = profile.sizes, profile.seconds
    held_in = np.arange(len(tokens)) % 2 == 0
    held_in[-1] = True  # the grid's end, so that nothing is extrapolated
    half = Calibration(gpu=gpu_name, model=model, source="every other row", linear=Table(tokens[held_in],
                                                                                         measured[held_in]))
    layer_params = model.layers_params / model.num_layers  # llama-2-7b: every layer alike
    layer_bytes = layer_params * model.dtype_bytes
    return {
        "tokens": tokens, "measured": measured, "held_out": ~held_in,
        "roofline": np.maximum(2 * layer_params * tokens / gpu.peak_flops,
                               layer_bytes / gpu.hbm_bandwidth_bytes_per_s),
        "efficiency": StepTimeModel(model, gpu).linear_seconds(tokens) / model.num_layers,
        "calibrated": StepTimeModel(model, gpu, half).linear_seconds(tokens) / model.num_layers,
    }


def errors(p: dict[str, np.ndarray], name: str, low: int, high: int, held_out_only: bool = False) -> np.ndarray:
    selected = (p["tokens"] >= low) & (p["tokens"] <= high)
    if held_out_only:
        selected &= p["held_out"]
    return p[name][selected] / p["measured"][selected] - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="print every profiled shape")
    args = parser.parse_args()
    for gpu_name in PROFILES:
        p = predictions(gpu_name)
        print(f"\n{gpu_name}, Llama-2-7B linear layers, µs per layer (error vs measured)")
        print(f"{'tokens':>7} {'measured':>9} {'roofline':>17} {'efficiency':>17} {'calibrated':>17}")
        for i, tokens in enumerate(p["tokens"]):
            if not args.all and int(tokens) not in SHOWN:
                continue
            cells = [f"{p[n][i] * 1e6:8.1f} ({p[n][i] / p['measured'][i] - 1:+6.1%})"
                     for n in ("roofline", "efficiency", "calibrated")]
            mark = "" if p["held_out"][i] else "  (in the calibration)"
            print(f"{int(tokens):>7} {p['measured'][i] * 1e6:9.1f} {' '.join(cells)}{mark}")
        print("largest / median |error|:")
        for label, (low, high) in RANGES.items():
            parts = []
            for name in ("roofline", "efficiency", "calibrated"):
                e = np.abs(errors(p, name, low, high, held_out_only=name == "calibrated"))
                parts.append(f"{name} {e.max():.1%} / {np.median(e):.1%}")
            within = np.abs(errors(p, "calibrated", low, high, held_out_only=True)) <= 0.10
            print(f"  {label:<17} " + ", ".join(parts)
                  + f"; calibrated within 10 %: {within.sum()} of {within.size} held-out shapes")
        print_elementwise(gpu_name)


def print_elementwise(gpu_name: str) -> None:
    model, gpu = load_model("llama-2-7b"), load_gpu(gpu_name)
    measured = from_vidur(PROFILES[gpu_name], model, gpu_name).elementwise
    assert measured is not None
    shown = np.isin(measured.sizes, SHOWN)
    tokens = measured.sizes[shown]
    efficiency = StepTimeModel(model, gpu).elementwise_seconds(tokens) / model.num_layers
    print(f"{gpu_name}, element-wise kernels, µs per layer: measured / efficiency model (all {model.num_layers} "
          "layers, ms)")
    for n, m, e in zip(tokens, measured.seconds[shown], efficiency, strict=True):
        print(f"{int(n):>7} {m * 1e6:9.1f} {e * 1e6:9.1f}  x{m / e:<7.2f} ({m * model.num_layers * 1e3:.2f} ms "
              f"measured, {e * model.num_layers * 1e3:.2f} ms model)")


if __name__ == "__main__":
    main()
