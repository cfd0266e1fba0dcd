"""A sweep point's settings (apps/sweep_points.py): the defaults that depend on the engine alone."""

from __future__ import annotations

import pytest

from minipaged_cli.apps import sweep_points
from minipaged_cli.apps.sweep_points import Settings


def test_the_sweeps_prefix_caching_default_is_the_engines_without_reading_presets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_preset(name: str) -> None:
        raise AssertionError(f"preset {name} read to learn a default that depends on the engine only")

    monkeypatch.setattr(sweep_points, "load_model", no_preset)
    monkeypatch.setattr(sweep_points, "load_gpu", no_preset)
    # vLLM 0.33.0: v1 enables prefix caching by default (vllm serve); v0 never did.
    assert Settings().engine_prefix_caching() is True
    assert Settings(engine={"scheduler": "v1"}).engine_prefix_caching() is True
    assert Settings(engine={"scheduler": "v0"}).engine_prefix_caching() is False
