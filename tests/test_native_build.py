"""``native_build.build_extension``: a C file built once into an importable module and then loaded from the cache,
and each way a build cannot happen said as a RuntimeError (what ``pool_loops`` turns into the Python loops)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from minipaged_cli import native_build
from minipaged_cli.native_build import build_extension
from tests.conftest import REQUIRE_SHARED, skip_unless_required

ANSWER = """#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_answer", .m_size = -1, .m_methods = methods};
PyMODINIT_FUNC PyInit__answer(void) { return PyModule_Create(&module); }
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        skip_unless_required("no C compiler", REQUIRE_SHARED)
    return tmp_path / "cache" / "minipaged"


def test_a_module_is_built_once_then_loaded_from_the_cache(tmp_path: Path, cache: Path) -> None:
    source = tmp_path / "answer.c"
    source.write_text(ANSWER)
    assert build_extension("_answer", source).answer() == 42
    [built] = cache.iterdir()
    stamp = built.stat().st_mtime_ns
    assert build_extension("_answer", source).answer() == 42
    assert [path.stat().st_mtime_ns for path in cache.iterdir()] == [stamp]  # (not compiled again)
    source.write_text(ANSWER.replace("42", "43"))  # another source: another build beside it
    assert build_extension("_answer", source).answer() == 43
    assert len(list(cache.iterdir())) == 2


def test_a_header_of_its_own_is_part_of_the_source(tmp_path: Path, cache: Path) -> None:
    """A quoted include beside the source (``full_attention_steps.h``: the pool's loops and the replay's) is read
    with it: another header is another build, and one that cannot be read is a failed build."""
    source, header = tmp_path / "answer.c", tmp_path / "number.h"
    source.write_text(ANSWER.replace("#include <Python.h>", '#include <Python.h>\n#include "number.h"')
                      .replace("PyLong_FromLong(42)", "PyLong_FromLong(NUMBER)"))
    header.write_text("#define NUMBER 42\n")
    assert build_extension("_answer", source).answer() == 42
    header.write_text("#define NUMBER 43\n")
    assert build_extension("_answer", source).answer() == 43
    assert len(list(cache.iterdir())) == 2
    header.unlink()
    with pytest.raises(RuntimeError, match=r"its header number\.h cannot be read"):
        build_extension("_answer", source)


def test_a_build_that_fails_says_what_the_compiler_said(tmp_path: Path, cache: Path) -> None:
    source = tmp_path / "broken.c"
    source.write_text(ANSWER.replace("return PyLong_FromLong(42);", "return undeclared_name;"))
    with pytest.raises(RuntimeError, match=r"(?s)compiling _answer failed:.*undeclared_name"):
        build_extension("_answer", source)
    assert list(cache.iterdir()) == []  # (nothing half-built is cached)


def test_a_compiler_that_is_not_there_is_a_failed_build(tmp_path: Path, cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    source = tmp_path / "answer.c"
    source.write_text(ANSWER)
    with pytest.raises(RuntimeError, match="compiling _answer failed"):
        build_extension("_answer", source)


def test_minipaged_native_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    native_build.native_setting.cache_clear()
    monkeypatch.setenv("MINIPAGED_NATIVE", "0")
    assert native_build.native_setting() == "0"
    native_build.native_setting.cache_clear()
    monkeypatch.delenv("MINIPAGED_NATIVE")
    assert native_build.native_setting() == ""
    native_build.native_setting.cache_clear()
