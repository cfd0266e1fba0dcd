"""The run-time C++ builds: cached per source, flags and CPU, so a shared home never loads another CPU's build."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from minipaged_cli.dataplane import build, kernels

# A one-line library stands for the kernels: what is tested is the cache's key, not the code.
SOURCE = 'extern "C" int answer() { return 42; }\n'


@pytest.mark.native_build
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler")
def test_a_library_built_on_one_cpu_is_not_loaded_on_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(kernels, "CUDA_DIR", tmp_path)
    (tmp_path / "answer.cpp").write_text(SOURCE)
    cache = tmp_path / "home" / "minipaged"

    def build_on(cpu: str) -> list[str]:
        monkeypatch.setattr(build, "cpu_identity", lambda: cpu, raising=False)
        library = build.build_library("answer", ("answer.cpp",), "answer.cpp", ["-O1", "-march=native"])
        assert library.answer() == 42
        return sorted(p.name for p in cache.glob("*.so"))

    first = build_on("GenuineIntel Xeon flags: avx2 avx512f")
    assert len(first) == 1
    # the same sources and flags on an older CPU of the same home: a build of its own, not the AVX-512 one
    second = build_on("GenuineIntel Xeon flags: avx2")
    assert len(second) == 2 and set(first) < set(second)
    assert build_on("GenuineIntel Xeon flags: avx2 avx512f") == second  # back on the first CPU: its cached build


def test_the_cpu_identity_names_this_machine_and_is_stable() -> None:
    identity = build.cpu_identity()
    assert identity == build.cpu_identity()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith(("flags", "Features"))),
                     None)
        if flags is not None:
            assert flags in identity.splitlines()
