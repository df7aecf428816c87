"""A real container registry for the template tests: the CNCF distribution
registry (scripts/setup.sh builds it) on a local port, and small images
pushed to it over the registry API: static busybox with its applets, a
user database, and files. Nothing reaches Docker Hub.

Run as a program, it serves the JS conformance suite and
scripts/e2b-upstream.sh: it starts a registry, pushes each ``--push
REPO:TAG``, prints ``{"host": ...}`` as a line, then reads requests as
JSON lines from stdin and answers each with a line: ``{"push": REPO,
"tag": TAG, "files": {path: text}}`` -> ``{"ref": ...}``; ``{"stop":
true}`` -> ``{"stopped": true}`` (the registry is down, the program waits
on). End of stdin stops it and removes its files."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import sys
import time
from typing import Dict, Optional

import httpx

REGISTRY_BIN = "/usr/local/lib/cellfork/bin/registry"
BUSYBOX = "/bin/busybox"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """A running registry; ``host`` is 127.0.0.1:PORT."""

    def __init__(self) -> None:
        if not os.path.exists(REGISTRY_BIN):
            raise RuntimeError(f"{REGISTRY_BIN} missing: run `make setup`")
        self.dir = tempfile.mkdtemp(prefix="cellfork-registry-")
        self.host = f"127.0.0.1:{_free_port()}"
        cfg = os.path.join(self.dir, "config.yml")
        with open(cfg, "w") as f:
            f.write(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {self.dir}/data\n"
                    f"http:\n  addr: {self.host}\n")
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(f"http://{self.host}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the registry did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the registry (its address then refuses connections)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def remove(self) -> None:
        """Stop the registry and remove its files."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def push(self, repo: str, tag: str, files: Optional[Dict[str, str]] = None, env: Optional[list] = None) -> str:
        """Push a busybox image with ``files`` (path -> text) as REPO:TAG and
        return its full reference."""
        layer, diff_id = busybox_layer(files or {})
        base = f"http://{self.host}/v2/{repo}"
        layer_digest = self._blob(base, layer)
        config = json.dumps({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": env or ["PATH=/bin:/usr/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }).encode()
        config_digest = self._blob(base, config)
        manifest = {
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": len(layer)}],
        }
        r = httpx.put(f"{base}/manifests/{tag}", content=json.dumps(manifest).encode(),
                      headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, timeout=30)
        r.raise_for_status()
        return f"{self.host}/{repo}:{tag}"

    @staticmethod
    def _blob(base: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        r = httpx.post(f"{base}/blobs/uploads/", timeout=30)
        r.raise_for_status()
        loc = r.headers["Location"]
        url = loc if loc.startswith("http") else f"{base.split('/v2/')[0]}{loc}"
        sep = "&" if "?" in url else "?"
        r = httpx.put(f"{url}{sep}digest={digest}", content=data,
                      headers={"Content-Type": "application/octet-stream"}, timeout=60)
        r.raise_for_status()
        return digest


def busybox_layer(files: Dict[str, str]) -> tuple:
    """A gzipped layer: busybox, a symlink per applet, root-only passwd and
    group, /tmp, and files. Returns (gzipped bytes, diff id of the tar)."""
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        def add_file(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        for d in ("bin", "etc", "root", "home", "usr", "usr/bin", "var", "www"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        with open(BUSYBOX, "rb") as f:
            add_file("bin/busybox", f.read(), 0o755)
        for a in applets:
            if a != "busybox":
                info = tarfile.TarInfo(f"bin/{a}")
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, "busybox", 0o777
                tar.addfile(info)
        add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        add_file("etc/group", b"root:x:0:\n")
        for path, text in files.items():
            add_file(path, text.encode())
    data = raw.getvalue()
    return gzip.compress(data, mtime=0), "sha256:" + hashlib.sha256(data).hexdigest()


def main(argv) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--push", action="append", default=[], metavar="REPO:TAG", help="push a busybox image at start")
    args = ap.parse_args(argv)
    reg = Registry()
    try:
        for ref in args.push:
            repo, _, tag = ref.rpartition(":")
            reg.push(repo, tag)
        print(json.dumps({"host": reg.host}), flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                if req.get("stop"):
                    reg.stop()
                    answer = {"stopped": True}
                else:
                    answer = {"ref": reg.push(req["push"], req["tag"], files=req.get("files"))}
            except Exception as e:  # noqa: BLE001 - the caller sees every failure as an answer
                answer = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(answer), flush=True)
    finally:
        reg.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
