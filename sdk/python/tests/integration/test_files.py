"""Filesystem against the real daemon."""

import uuid

import pytest

from cellfork import EntryInfo, FileType, NotFoundError, WriteInfo

pytestmark = pytest.mark.integration


@pytest.fixture
def workdir(sandbox):
    path = f"/home/user/cf-test-{uuid.uuid4().hex[:8]}"
    yield path
    sandbox.commands.run(f"rm -rf {path}", user="root")


def test_write_read_text(sandbox, workdir):
    path = f"{workdir}/nested/hello.txt"  # parents are created
    info = sandbox.files.write(path, "héllo\nwörld")
    assert isinstance(info, WriteInfo)
    assert (info.path, info.name, info.type) == (path, "hello.txt", FileType.FILE)
    assert sandbox.files.read(path) == "héllo\nwörld"
    assert sandbox.commands.run(f"cat {path}").stdout == "héllo\nwörld"
    sandbox.files.write(path, "short")  # overwrite
    assert sandbox.files.read(path) == "short"


def test_write_read_bytes(sandbox, workdir):
    data = bytes(range(256)) * 64
    sandbox.files.write(f"{workdir}/blob.bin", data)
    assert sandbox.files.read(f"{workdir}/blob.bin", format="bytes") == data


def test_files_belong_to_the_user(sandbox, workdir):
    sandbox.files.write(f"{workdir}/mine.txt", "x")
    assert sandbox.commands.run(f"stat -c %U {workdir}/mine.txt").stdout == "user\n"
    sandbox.files.write("/root/cf-root-file.txt", "r", user="root")
    assert sandbox.files.read("/root/cf-root-file.txt", user="root") == "r"
    sandbox.files.remove("/root/cf-root-file.txt", user="root")


def test_list(sandbox, workdir):
    sandbox.files.write(f"{workdir}/a.txt", "aaa")
    sandbox.files.write(f"{workdir}/b.txt", "b")
    assert sandbox.files.make_dir(f"{workdir}/sub") is True
    entries = {e.name: e for e in sandbox.files.list(workdir)}
    assert set(entries) == {"a.txt", "b.txt", "sub"}
    assert all(isinstance(e, EntryInfo) for e in entries.values())
    assert entries["a.txt"].type == FileType.FILE and entries["a.txt"].size == 3
    assert entries["a.txt"].path == f"{workdir}/a.txt"
    assert entries["sub"].type == FileType.DIR


def test_exists_remove_and_missing(sandbox, workdir):
    path = f"{workdir}/gone.txt"
    sandbox.files.write(path, "x")
    assert sandbox.files.exists(path) is True
    sandbox.files.remove(path)
    assert sandbox.files.exists(path) is False
    with pytest.raises(NotFoundError) as info:
        sandbox.files.read(path)
    assert info.value.status_code == 404
    sandbox.files.remove(path)  # a path already gone: nothing to do, as E2B's envd
    with pytest.raises(NotFoundError):
        sandbox.files.list(f"{workdir}/no-such-dir")


def test_make_dir(sandbox, workdir):
    assert sandbox.files.make_dir(f"{workdir}/d1/d2") is True
    assert sandbox.files.make_dir(f"{workdir}/d1/d2") is False
    assert sandbox.files.exists(f"{workdir}/d1/d2")
    sandbox.files.remove(f"{workdir}/d1")
    assert not sandbox.files.exists(f"{workdir}/d1")
