"""Output files: refused before the work when they cannot be written, and never left half-written."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from minipaged_cli.cli.outputs import atomic_output, check_outputs, write_text
from minipaged_cli.errors import InputError


def test_check_outputs_accepts_new_and_existing_files_stdout_and_none(tmp_path: Path) -> None:
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    check_outputs({"--json": str(existing), "--csv": tmp_path / "new.csv", "--plot": None, "OUT": "-"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # the probe file is gone


@pytest.mark.parametrize(("make", "says"), [
    (lambda d: d / "missing" / "x.json", "no such directory"),
    (lambda d: d, "is a directory"),
    (lambda d: d / "file.txt" / "x.json", "not a directory"),
])
def test_check_outputs_names_the_option_the_path_and_the_reason(tmp_path: Path, make, says: str) -> None:
    (tmp_path / "file.txt").write_text("")
    path = make(tmp_path)
    with pytest.raises(InputError) as error:
        check_outputs({"--json": str(path)})
    assert error.value.field == "--json" and error.value.value == str(path)
    assert says in str(error.value)


def test_check_outputs_refuses_a_directory_that_takes_no_file(tmp_path: Path, monkeypatch) -> None:
    # root writes through chmod 0o500, so the refusal is simulated where the probe creates its file
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", refuse)
    with pytest.raises(InputError, match=r"--plot: .*cannot write in .*Permission denied"):
        check_outputs({"--plot": str(tmp_path / "p.png")})


def test_check_outputs_refuses_two_options_naming_one_file(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "out.json")
    with pytest.raises(InputError, match=r"--csv: .*--json names the same file"):
        check_outputs({"--json": str(tmp_path / "out.json"), "--csv": str(link)})


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text('{"old": 1}')
    with pytest.raises(RuntimeError), atomic_output(path, "--json") as temporary:
        temporary.write_text('{"new": ')
        raise RuntimeError("the writer died half way")
    assert json.loads(path.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_write_text_replaces_keeps_the_mode_and_writes_through_a_symlink(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("old")
    path.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    write_text(link, "new\n", "--json")
    assert link.is_symlink() and path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    fresh = tmp_path / "fresh.json"
    write_text(fresh, "x", "--json")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask  # as open(..., "w") would have made it


def test_a_device_is_written_in_place_not_replaced() -> None:
    check_outputs({"--json": "/dev/null"})
    write_text("/dev/null", "discarded", "--json")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_write_errors_are_input_errors_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"--csv: '.*x.csv': cannot write: No such file or directory"):
        write_text(tmp_path / "gone" / "x.csv", "a,b\n", "--csv")
