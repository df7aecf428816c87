"""envd filesystem through the sync SDK: /files uploads and downloads
(multipart, octet-stream, gzip, multi-file, metadata, signed URLs) and the
filesystem Connect service (stat, list, mkdir, move, remove, watchers)
(spec §4.1, §4.4, §4.5)."""

from __future__ import annotations

import io
import os
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from e2b import (
    EntryInfo,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
)

from ._util import CLUSTER, routing_headers, unique, wait_until

pytestmark = pytest.mark.timeout(60)

ENVD_PORT = 49983


@pytest.fixture(scope="module")
def sbx(module_sandbox_factory) -> Sandbox:
    """One sandbox for the module; every test works in its own directory."""
    return module_sandbox_factory()


@pytest.fixture
def d(sbx) -> str:
    """A fresh directory in the default user's home."""
    path = f"/home/user/{unique('fs')}"
    assert sbx.files.make_dir(path) is True
    return path


# --- write / read ----------------------------------------------------------------


def test_write_read_text(sbx, d):
    path = f"{d}/hello.txt"
    info = sbx.files.write(path, "hello wörld\n")
    assert info.name == "hello.txt"
    assert info.path == path
    assert info.type == FileType.FILE
    assert sbx.files.read(path) == "hello wörld\n"
    assert sbx.files.read(path, format="text") == "hello wörld\n"
    # Visible to commands, owned by the default user.
    assert sbx.commands.run(f"cat {path}; stat -c %U {path}").stdout == "hello wörld\nuser\n"


def test_write_overwrites_and_creates_parents(sbx, d):
    path = f"{d}/a/b/c/deep.txt"
    sbx.files.write(path, "first version, long")
    sbx.files.write(path, "second")
    assert sbx.files.read(path) == "second"
    assert sbx.files.get_info(f"{d}/a/b").type == FileType.DIR


def test_write_read_bytes(sbx, d):
    data = bytes(range(256)) * 64
    sbx.files.write(f"{d}/bin.dat", data)
    got = sbx.files.read(f"{d}/bin.dat", format="bytes")
    assert isinstance(got, bytearray)
    assert bytes(got) == data


def test_read_stream(sbx, d):
    data = os.urandom(3 * 1024 * 1024 + 17)
    sbx.files.write(f"{d}/big.bin", data)
    chunks = []
    with sbx.files.read(f"{d}/big.bin", format="stream") as reader:
        for chunk in reader:
            chunks.append(bytes(chunk))
    assert b"".join(chunks) == data


def test_write_empty_file(sbx, d):
    sbx.files.write(f"{d}/empty", "")
    assert sbx.files.read(f"{d}/empty") == ""
    assert sbx.files.get_info(f"{d}/empty").size == 0


def test_write_files_multi_upload(sbx, d):
    entries = [
        {"path": f"{d}/m1.txt", "data": "one"},
        {"path": f"{d}/sub/m2.bin", "data": b"\x00\x01two"},
        {"path": f"{d}/m3.txt", "data": io.BytesIO(b"three")},
    ]
    infos = sbx.files.write_files(entries)
    assert [i.path for i in infos] == [e["path"] for e in entries]
    assert [i.name for i in infos] == ["m1.txt", "m2.bin", "m3.txt"]
    assert all(i.type == FileType.FILE for i in infos)
    assert sbx.files.read(f"{d}/m1.txt") == "one"
    assert bytes(sbx.files.read(f"{d}/sub/m2.bin", format="bytes")) == b"\x00\x01two"
    assert sbx.files.read(f"{d}/m3.txt") == "three"


def test_write_files_multipart_only(sbx, d):
    # Several str/bytes entries without octet-stream: ONE multipart request
    # without a path query; each part's filename is its path (spec §4.5).
    entries = [{"path": f"{d}/mp{i}.txt", "data": f"part {i}"} for i in range(3)]
    infos = sbx.files.write_files(entries, use_octet_stream=False)
    assert [i.path for i in infos] == [e["path"] for e in entries]
    for e in entries:
        assert sbx.files.read(e["path"]) == e["data"]


def test_write_octet_stream(sbx, d):
    data = os.urandom(100_000)
    info = sbx.files.write(f"{d}/octet.bin", data, use_octet_stream=True)
    assert info.path == f"{d}/octet.bin"
    assert bytes(sbx.files.read(f"{d}/octet.bin", format="bytes")) == data
    # File-like objects and iterables of chunks are streamed as octet-stream.
    sbx.files.write(f"{d}/filelike.txt", io.BytesIO(b"from a file object"))
    assert sbx.files.read(f"{d}/filelike.txt") == "from a file object"
    sbx.files.write(f"{d}/iter.txt", iter([b"chunk1-", b"chunk2-", b"chunk3"]))
    assert sbx.files.read(f"{d}/iter.txt") == "chunk1-chunk2-chunk3"


def test_write_gzip_and_read_gzip(sbx, d):
    data = ("compressible line\n" * 5000).encode()
    info = sbx.files.write(f"{d}/gz.txt", data, gzip=True)
    assert info.path == f"{d}/gz.txt"
    # Stored inflated (the server decompresses Content-Encoding: gzip).
    assert bytes(sbx.files.read(f"{d}/gz.txt", format="bytes")) == data
    assert sbx.files.get_info(f"{d}/gz.txt").size == len(data)
    # Download asking for gzip (Accept-Encoding: gzip) yields the same bytes.
    assert bytes(sbx.files.read(f"{d}/gz.txt", format="bytes", gzip=True)) == data
    # Multi-file gzip upload.
    infos = sbx.files.write_files(
        [{"path": f"{d}/gz1", "data": "g1"}, {"path": f"{d}/gz2", "data": "g2"}], gzip=True
    )
    assert [i.name for i in infos] == ["gz1", "gz2"]
    assert sbx.files.read(f"{d}/gz2") == "g2"


def test_write_as_root(sbx):
    path = f"/root/{unique('root')}.txt"
    info = sbx.files.write(path, "root only", user="root")
    assert info.path == path
    assert sbx.files.read(path, user="root") == "root only"
    assert sbx.files.get_info(path, user="root").owner == "root"


def test_write_with_metadata(sbx, d):
    path = f"{d}/meta.txt"
    info = sbx.files.write(path, "with metadata", metadata={"Owner": "alice", "stage": "raw"})
    # Keys are lower-cased by the sandbox (SDK docs; upstream user.e2b.* xattrs).
    assert info.metadata == {"owner": "alice", "stage": "raw"}
    assert sbx.files.get_info(path).metadata == {"owner": "alice", "stage": "raw"}
    listed = {e.name: e for e in sbx.files.list(d)}
    assert listed["meta.txt"].metadata == {"owner": "alice", "stage": "raw"}
    # Files written without metadata report none.
    sbx.files.write(f"{d}/plain.txt", "x")
    assert not sbx.files.get_info(f"{d}/plain.txt").metadata


def test_read_missing_file_raises_file_not_found(sbx, d):
    with pytest.raises(FileNotFoundException):
        sbx.files.read(f"{d}/nope.txt")
    with pytest.raises(NotFoundException):
        sbx.files.read(f"{d}/nope.txt", format="bytes")
    with pytest.raises(FileNotFoundException):
        sbx.files.read(f"{d}/nope.txt", format="stream")


def test_read_directory_is_invalid_argument(sbx, d):
    with pytest.raises(InvalidArgumentException):
        sbx.files.read(d)


# --- filesystem RPCs -----------------------------------------------------------------


def test_exists(sbx, d):
    sbx.files.write(f"{d}/e.txt", "e")
    assert sbx.files.exists(f"{d}/e.txt") is True
    assert sbx.files.exists(d) is True
    assert sbx.files.exists(f"{d}/missing") is False


def test_get_info(sbx, d):
    before = datetime.now(timezone.utc) - timedelta(seconds=30)
    sbx.files.write(f"{d}/info.txt", "12345")
    info = sbx.files.get_info(f"{d}/info.txt")
    assert isinstance(info, EntryInfo)
    assert info.name == "info.txt"
    assert info.path == f"{d}/info.txt"
    assert info.type == FileType.FILE
    assert info.size == 5
    assert info.owner == "user"
    assert info.group == "user"
    assert info.permissions == "-rw-r--r--"
    assert info.mode & 0o777 == 0o644
    assert before <= info.modified_time <= datetime.now(timezone.utc) + timedelta(seconds=30)

    dinfo = sbx.files.get_info(d)
    assert dinfo.type == FileType.DIR
    assert dinfo.name == os.path.basename(d)
    assert dinfo.permissions.startswith("d")

    with pytest.raises(FileNotFoundException):
        sbx.files.get_info(f"{d}/missing")


def test_symlink_info(sbx, d):
    sbx.files.write(f"{d}/target.txt", "t")
    sbx.commands.run(f"ln -s {d}/target.txt {d}/link")
    info = sbx.files.get_info(f"{d}/link")
    assert info.symlink_target == f"{d}/target.txt"
    assert info.name == "link"


def test_list_depth(sbx, d):
    sbx.files.write(f"{d}/top.txt", "t")
    sbx.files.write(f"{d}/sub/inner.txt", "i")
    sbx.files.write(f"{d}/sub/deeper/leaf.txt", "l")

    one = sbx.files.list(d)
    assert sorted((e.name, e.type) for e in one) == [("sub", FileType.DIR), ("top.txt", FileType.FILE)]
    by_name = {e.name: e for e in one}
    assert by_name["top.txt"].path == f"{d}/top.txt"
    assert by_name["top.txt"].size == 1

    two = sbx.files.list(d, depth=2)
    assert sorted(e.path for e in two) == sorted(
        [f"{d}/top.txt", f"{d}/sub", f"{d}/sub/inner.txt", f"{d}/sub/deeper"]
    )
    three = sbx.files.list(d, depth=3)
    assert f"{d}/sub/deeper/leaf.txt" in [e.path for e in three]

    with pytest.raises(FileNotFoundException):
        sbx.files.list(f"{d}/missing")


def test_make_dir(sbx, d):
    assert sbx.files.make_dir(f"{d}/new") is True
    assert sbx.files.make_dir(f"{d}/new") is False
    assert sbx.files.make_dir(f"{d}/x/y/z") is True
    assert sbx.files.get_info(f"{d}/x/y/z").type == FileType.DIR
    assert sbx.files.get_info(f"{d}/x/y/z").owner == "user"


def test_rename(sbx, d):
    sbx.files.write(f"{d}/old.txt", "moving")
    info = sbx.files.rename(f"{d}/old.txt", f"{d}/new.txt")
    assert info.name == "new.txt"
    assert info.path == f"{d}/new.txt"
    assert info.type == FileType.FILE
    assert sbx.files.exists(f"{d}/old.txt") is False
    assert sbx.files.read(f"{d}/new.txt") == "moving"
    # Directories move too.
    sbx.files.write(f"{d}/dir1/f", "f")
    sbx.files.rename(f"{d}/dir1", f"{d}/dir2")
    assert sbx.files.read(f"{d}/dir2/f") == "f"
    with pytest.raises(FileNotFoundException):
        sbx.files.rename(f"{d}/missing", f"{d}/whatever")


def test_remove(sbx, d):
    sbx.files.write(f"{d}/rm.txt", "x")
    sbx.files.remove(f"{d}/rm.txt")
    assert sbx.files.exists(f"{d}/rm.txt") is False
    sbx.files.write(f"{d}/tree/a/b.txt", "x")
    sbx.files.remove(f"{d}/tree")
    assert sbx.files.exists(f"{d}/tree") is False


# --- E2B's envd semantics ---------------------------------------------------------------


def test_relative_paths_are_the_homes(sbx):
    # Every file operation resolves a relative path against the user's home,
    # as E2B's envd does.
    d = unique("rel")
    assert sbx.files.make_dir(d) is True
    info = sbx.files.write(f"{d}/a.txt", "relative")
    assert info.path == f"/home/user/{d}/a.txt"
    assert sbx.files.read(f"{d}/a.txt") == "relative"
    assert sbx.files.read(f"/home/user/{d}/a.txt") == "relative"
    assert sbx.files.exists(f"{d}/a.txt") is True
    assert sbx.files.get_info(f"{d}/a.txt").path == f"/home/user/{d}/a.txt"
    assert [e.path for e in sbx.files.list(d)] == [f"/home/user/{d}/a.txt"]
    infos = sbx.files.write_files([{"path": f"{d}/m1", "data": "1"}, {"path": f"{d}/m2", "data": b"2"}])
    assert [i.path for i in infos] == [f"/home/user/{d}/m1", f"/home/user/{d}/m2"]
    oct_info = sbx.files.write(f"{d}/o.bin", io.BytesIO(b"octets"), use_octet_stream=True)
    assert oct_info.path == f"/home/user/{d}/o.bin"
    moved = sbx.files.rename(f"{d}/a.txt", f"{d}/sub/b.txt")
    assert moved.path == f"/home/user/{d}/sub/b.txt"
    assert sbx.files.read(f"./{d}/sub/../sub/b.txt") == "relative"
    sbx.files.remove(f"{d}/sub")
    assert sbx.files.exists(f"{d}/sub") is False
    # As root, the home is /root.
    assert sbx.files.write(f"{d}.txt", "r", user="root").path == f"/root/{d}.txt"
    with pytest.raises(FileNotFoundException):
        sbx.files.read(f"{d}.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.get_info(unique("missing"))
    with pytest.raises(FileNotFoundException):
        sbx.files.watch_dir(unique("missing"))


def test_remove_missing_path_succeeds(sbx, d):
    sbx.files.remove(f"{d}/never-existed")
    sbx.files.remove(unique("never-existed"))
    sbx.files.write(f"{d}/file", "x")
    sbx.files.remove(f"{d}/file/below")  # below a file: still nothing to remove
    assert sbx.files.read(f"{d}/file") == "x"


def test_overwrite_without_metadata_clears_it(sbx, d):
    path = f"{d}/meta.txt"
    sbx.files.write(path, "1", metadata={"author": "mish", "stage": "raw"})
    assert sbx.files.get_info(path).metadata == {"author": "mish", "stage": "raw"}
    # An upload's metadata is the file's whole metadata.
    assert sbx.files.write(path, "2", metadata={"stage": "clean"}).metadata == {"stage": "clean"}
    assert sbx.files.get_info(path).metadata == {"stage": "clean"}
    info = sbx.files.write(path, "3")
    assert not info.metadata
    assert not sbx.files.get_info(path).metadata
    # Also over octet-stream, and metadata set by hand inside the sandbox.
    sbx.commands.run(f"python3 -c \"import os; os.setxattr('{path}', 'user.e2b.extra', b'1')\"")
    assert sbx.files.get_info(path).metadata == {"extra": "1"}
    sbx.files.write(path, io.BytesIO(b"4"), use_octet_stream=True)
    assert not sbx.files.get_info(path).metadata
    assert sbx.files.read(path) == "4"


def test_read_proc_and_sys_files(sbx):
    # procfs files report size 0 and do not all seek: they are streamed.
    boot_id = sbx.files.read("/proc/sys/kernel/random/boot_id").strip()
    assert len(boot_id) == 36
    assert boot_id == sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert sbx.files.get_info("/proc/sys/kernel/random/boot_id").size == 0
    assert sbx.files.read("/proc/self/status").startswith("Name:")
    assert bytes(sbx.files.read("/proc/mounts", format="bytes"))
    with sbx.files.read("/proc/cpuinfo", format="stream") as chunks:
        assert b"".join(bytes(c) for c in chunks)


def test_watch_poll_right_after_write_sees_it(sbx, d):
    # get_new_events() right after a write answers with its events (the poll
    # drains what the kernel queued), every time: no waiting needed.
    handle = sbx.files.watch_dir(d)
    try:
        for i in range(10):
            sbx.files.write(f"{d}/w{i}.txt", "x")
            events = handle.get_new_events()
            # A new file: created, given to its user, written (as upstream:
            # E2B's test_watch_iterated counts three).
            assert sorted((e.type.name, e.name) for e in events) == sorted(
                [("CREATE", f"w{i}.txt"), ("CHMOD", f"w{i}.txt"), ("WRITE", f"w{i}.txt")]
            ), events
        sbx.files.write(f"{d}/w0.txt", "again")
        assert FilesystemEventType.WRITE in [e.type for e in handle.get_new_events()]
    finally:
        handle.stop()


# --- signed URLs ------------------------------------------------------------------------
# On a single URL (E2B_SANDBOX_URL, no wildcard domain) a signed URL is that
# URL plus /files?path=...&signature=...: it names no sandbox, and works as it
# is, with nothing added (the signature names the sandbox). With the routing
# headers it works too. A cluster gateway routes the data plane by sandbox id
# only: there a signed URL needs the headers (or the region's wildcard
# domain), which the strict xfail records until the gateway learns it.
VIA = [
    pytest.param(
        "single URL",
        marks=pytest.mark.xfail(
            CLUSTER, strict=True, reason="the cluster gateway does not route a signed URL that names no sandbox"
        ),
    ),
    "routing headers",
]


def _via(via: str, sbx: Sandbox) -> dict:
    return routing_headers(sbx.sandbox_id, ENVD_PORT) if via == "routing headers" else {}


@pytest.mark.parametrize("via", VIA)
def test_download_url(sbx, d, sandbox_url, via):
    path = f"{d}/dl.txt"
    sbx.files.write(path, "download me")
    url = sbx.download_url(path)
    assert "signature=v1_" in url
    assert url.startswith(f"{sandbox_url}/files?") and sbx.sandbox_id not in url
    r = httpx.get(url, headers=_via(via, sbx), timeout=30)
    assert r.status_code == 200, r.text
    assert r.content == b"download me"

    url = sbx.download_url(path, use_signature_expiration=120)
    assert "signature_expiration=" in url
    r = httpx.get(url, headers=_via(via, sbx), timeout=30)
    assert r.status_code == 200, r.text
    assert r.content == b"download me"


@pytest.mark.parametrize("via", VIA)
def test_download_url_relative_and_as_root(sbx, via):
    name = f"{unique('dl')}.txt"
    sbx.files.write(name, "relative")
    assert httpx.get(sbx.download_url(name), headers=_via(via, sbx), timeout=30).content == b"relative"
    sbx.files.write(name, "as root", user="root")
    r = httpx.get(sbx.download_url(name, user="root", use_signature_expiration=60), headers=_via(via, sbx), timeout=30)
    assert r.status_code == 200 and r.content == b"as root"


@pytest.mark.parametrize("via", VIA)
def test_signed_url_rejects_bad_or_expired_signature(sbx, d, via):
    path = f"{d}/guarded.txt"
    sbx.files.write(path, "secret")
    h = _via(via, sbx)
    url = sbx.download_url(path)
    tampered = url.replace("signature=v1_", "signature=v1_A")
    r = httpx.get(tampered, headers=h, timeout=30)
    assert r.status_code == 401 and r.json() == {"code": 401, "message": "invalid signature"}
    # The signature is bound to the path.
    other = sbx.download_url(f"{d}/other.txt")
    forged = other.replace("other.txt", "guarded.txt")
    assert httpx.get(forged, headers=h, timeout=30).status_code == 401
    # Expired: envd's words, exactly (E2B's tests compare them).
    expired = sbx.download_url(path, use_signature_expiration=-60)
    r = httpx.get(expired, headers=h, timeout=30)
    assert r.status_code == 401
    assert r.json() == {"code": 401, "message": "signature is already expired"}
    # No signature and no access token: refused (with the routing headers by
    # the sandbox's edge; without them the single URL is the control plane's,
    # which wants an API key).
    bare = httpx.URL(url).copy_remove_param("signature")
    assert httpx.get(bare, headers=h, timeout=30).status_code == 401


@pytest.mark.parametrize("via", VIA)
def test_signed_url_is_bound_to_its_sandbox(sbx, d, make_sandbox, via):
    # Signatures are keyed on the sandbox's own access token: a URL signed by
    # another sandbox opens that one, never this one.
    path = f"{d}/mine.txt"
    sbx.files.write(path, "mine")
    other = make_sandbox()
    other.files.write(path, "theirs")
    foreign = other.download_url(path)
    r = httpx.get(foreign, headers=routing_headers(sbx.sandbox_id, ENVD_PORT), timeout=30)
    assert r.status_code == 401
    assert httpx.get(foreign, headers=_via(via, other), timeout=30).content == b"theirs"
    r = httpx.get(sbx.download_url(path), headers=_via(via, sbx), timeout=30)
    assert r.status_code == 200 and r.content == b"mine"


@pytest.mark.parametrize("via", VIA)
def test_upload_url(sbx, d, via):
    path = f"{d}/up.txt"
    url = sbx.upload_url(path)
    assert "signature=v1_" in url
    h = _via(via, sbx)
    r = httpx.post(url, files={"file": ("up.txt", b"uploaded via signed url", "text/plain")}, headers=h, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, list) and body and body[0]["path"] == path
    assert sbx.files.read(path) == "uploaded via signed url"
    # Relative, with an expiry.
    name = f"{unique('up')}.txt"
    r = httpx.post(sbx.upload_url(name, use_signature_expiration=60), files={"file": ("x", b"rel")}, headers=h, timeout=30)
    assert r.status_code == 200 and r.json() == [{"name": name, "type": "file", "path": f"/home/user/{name}"}]
    # A read signature does not allow writing.
    r = httpx.post(sbx.download_url(path), files={"file": ("up.txt", b"nope", "text/plain")}, headers=h, timeout=30)
    assert r.status_code == 401
    assert sbx.files.read(path) == "uploaded via signed url"


# --- watch_dir (sync: CreateWatcher / GetWatcherEvents / RemoveWatcher) ------------------


def _collect(handle, want, timeout=10):
    """Poll get_new_events until every (type, name) in ``want`` was seen."""
    seen = []

    def check():
        seen.extend(handle.get_new_events())
        got = {(e.type, e.name) for e in seen}
        return want <= got

    wait_until(check, timeout=timeout, interval=0.2, what=f"watch events {want}")
    return seen


def test_watch_dir_polling(sbx, d):
    handle = sbx.files.watch_dir(d)
    try:
        assert handle.get_new_events() == []
        sbx.files.write(f"{d}/w.txt", "one")
        events = _collect(handle, {(FilesystemEventType.CREATE, "w.txt")})
        assert all(e.name == "w.txt" for e in events)
        sbx.commands.run(f"echo more >> {d}/w.txt")
        _collect(handle, {(FilesystemEventType.WRITE, "w.txt")})
        sbx.files.rename(f"{d}/w.txt", f"{d}/w2.txt")
        _collect(handle, {(FilesystemEventType.RENAME, "w.txt"), (FilesystemEventType.CREATE, "w2.txt")})
        sbx.commands.run(f"chmod 600 {d}/w2.txt")
        _collect(handle, {(FilesystemEventType.CHMOD, "w2.txt")})
        sbx.files.remove(f"{d}/w2.txt")
        _collect(handle, {(FilesystemEventType.REMOVE, "w2.txt")})
    finally:
        handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()


def test_watch_dir_recursive_with_entry(sbx, d):
    sbx.files.make_dir(f"{d}/nested")
    handle = sbx.files.watch_dir(d, recursive=True, include_entry=True)
    try:
        sbx.files.write(f"{d}/nested/deep.txt", "deep")
        events = _collect(handle, {(FilesystemEventType.CREATE, "nested/deep.txt")})
        created = [e for e in events if e.type == FilesystemEventType.CREATE and e.name == "nested/deep.txt"]
        assert created[0].entry is not None
        assert created[0].entry.path == f"{d}/nested/deep.txt"
        assert created[0].entry.type == FileType.FILE
    finally:
        handle.stop()


def test_watch_dir_non_recursive_ignores_subdirs(sbx, d):
    sbx.files.make_dir(f"{d}/sub")
    handle = sbx.files.watch_dir(d)
    try:
        sbx.files.write(f"{d}/sub/hidden.txt", "x")
        sbx.files.write(f"{d}/visible.txt", "x")
        events = _collect(handle, {(FilesystemEventType.CREATE, "visible.txt")})
        time.sleep(0.3)
        events += handle.get_new_events()
        assert not [e for e in events if "hidden" in e.name], events
    finally:
        handle.stop()


def test_watch_missing_dir_fails(sbx, d):
    with pytest.raises(FileNotFoundException):
        sbx.files.watch_dir(f"{d}/missing")
