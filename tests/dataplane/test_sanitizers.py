"""The kernels under sanitizers: tests/dataplane/kernel_driver.cpp over the edge cases (lengths 0 and 1, block sizes 1
and 128, a sequence ending in the pool's last block, split-K or not), built with ThreadSanitizer (the emulation, with
random yields at every synchronisation point, on a handful of cases) and with AddressSanitizer and UBSan's
alignment check (the emulation and the native CPU kernel, on all of them). Each must print its "ok" and report
nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from minipaged_cli.dataplane import kernels
from tests.conftest import REQUIRE_SHARED, ROOT, skip_unless_required
from tests.dataplane.test_kernel_mutations import build_command

pytestmark = [pytest.mark.native_build, pytest.mark.slow]

DRIVER = ROOT / "tests" / "dataplane" / "kernel_driver.cpp"
ADDRESS = ("-fsanitize=address,alignment", "-fno-sanitize-recover=all")
# name: (sanitizer flags, the driver's -D, what the driver is told)
BUILDS = {
    "thread-emulation": (("-fsanitize=thread", "-DEMU_RANDOM_YIELDS"), (), ["quick"]),
    "address-emulation": (ADDRESS, (), []),
    "address-native": (ADDRESS, ("-DNATIVE",), []),
}


def _runtime_missing(compiler: str, flag: str) -> bool:
    library = "libtsan.so" if flag == "-fsanitize=thread" else "libasan.so"
    found = subprocess.run([compiler, f"-print-file-name={library}"], capture_output=True, text=True).stdout.strip()
    return not os.path.isabs(found)


@pytest.fixture(scope="module")
def drivers(tmp_path_factory) -> dict[str, Path]:
    """The three driver programs, built side by side; the emulated ones link the kernels as a library."""
    compiler = os.environ.get("CXX") or shutil.which("g++")
    if compiler is None or any(_runtime_missing(compiler, flag) for flag in ("-fsanitize=thread",
                                                                              "-fsanitize=address")):
        skip_unless_required("needs g++ with the thread and address sanitizers", REQUIRE_SHARED)
    folder = tmp_path_factory.mktemp("sanitizers")
    steps = {}
    for name, (sanitizer, defines, _) in BUILDS.items():
        program = folder / name
        driver = [compiler, "-std=c++20", "-O1", "-g", "-pthread", *sanitizer, *defines, str(DRIVER), "-o",
                  str(program)]
        if "-DNATIVE" in defines:
            steps[name] = [driver]
        else:
            library = folder / f"lib{name}.so"
            steps[name] = [build_command(kernels.CUDA_DIR, library, ("-g", *sanitizer)),
                           [*driver, str(library), f"-Wl,-rpath,{folder}"]]
    running = {name: subprocess.Popen(commands[0], stderr=subprocess.PIPE, text=True)
               for name, commands in steps.items()}
    for name, process in running.items():
        assert process.wait() == 0, f"{name}: {process.stderr.read()[-3000:]}"
        for command in steps[name][1:]:
            result = subprocess.run(command, capture_output=True, text=True)
            assert result.returncode == 0, f"{name}: {result.stderr[-3000:]}"
    return {name: folder / name for name in BUILDS}


@pytest.mark.parametrize("name", BUILDS)
def test_the_kernels_are_clean_under_sanitizers(drivers: dict[str, Path], name: str) -> None:
    result = subprocess.run([str(drivers[name]), *BUILDS[name][2]], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0", "TSAN_OPTIONS": "halt_on_error=1"})
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert result.stdout.startswith("ok "), result.stdout
    assert "Sanitizer" not in result.stderr and "runtime error" not in result.stderr, result.stderr[-4000:]
