"""The template builder, file packing and the build flow of both twins
against a mock of the daemon's template API."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest

from cellfork import AsyncTemplate, Template, TemplateBuildError, wait_for_port, wait_for_timeout
from cellfork._template import pack_files


def _context(tmp_path):
    (tmp_path / "app").mkdir(exist_ok=True)
    (tmp_path / "app" / "main.py").write_text("print('hi')")
    (tmp_path / "app" / "data.txt").write_text("data")
    (tmp_path / "README").write_text("r")
    return tmp_path


def test_builder_serializes_like_e2b(tmp_path):
    t = (
        Template(file_context_path=_context(tmp_path))
        .from_image("python:3.12")
        .copy("app/*.py", "/app/", mode=0o755)
        .run_cmd(["pip install flask", "echo ok"], user="root")
        .set_envs({"A": "1"})
        .set_workdir("/app")
        .set_user("user")
        .skip_cache()
        .apt_install("vim")
        .set_start_cmd("python main.py", wait_for_port(8000))
    )
    body = t.to_dict()
    assert body["fromImage"] == "python:3.12"
    types = [s["type"] for s in body["steps"]]
    assert types == ["COPY", "RUN", "ENV", "WORKDIR", "USER", "RUN"]
    copy = body["steps"][0]
    assert copy["args"] == ["app/*.py", "/app/", "", "0755"] and len(copy["filesHash"]) == 64
    assert body["steps"][1]["args"] == ["pip install flask && echo ok", "root"]
    assert [s["force"] for s in body["steps"]] == [False] * 5 + [True]
    assert body["readyCmd"] == '[ -n "$(ss -Htuln sport = :8000)" ]' and body["startCmd"] == "python main.py"
    assert json.loads(t.to_json()) == body
    with pytest.raises(ValueError):
        Template().copy("../secret", "/x")
    with pytest.raises(ValueError):
        Template().from_image("x", username="u")


def test_pack_files_is_deterministic_and_selective(tmp_path):
    ctx = _context(tmp_path)
    a, ha = pack_files(str(ctx), "app/*.py")
    b, hb = pack_files(str(ctx), "app/*.py")
    assert ha == hb and a == b
    _, hall = pack_files(str(ctx), "app")
    assert hall != ha
    (ctx / "README").write_text("changed")  # not matched: same hash
    assert pack_files(str(ctx), "app/*.py")[1] == ha
    (ctx / "app" / "main.py").write_text("print('changed')")
    assert pack_files(str(ctx), "app/*.py")[1] != ha
    with pytest.raises(ValueError):
        pack_files(str(ctx), "nothing/*")


class FakeTemplateAPI:
    """Just enough of the daemon's template API: one build that logs two
    lines, then ends ready (or failed at step 1 when the step says fail)."""

    def __init__(self) -> None:
        self.uploads: dict[str, bytes] = {}
        self.started: dict | None = None
        self.polls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        if method == "POST" and path == "/v3/templates":
            body = json.loads(request.content)
            return httpx.Response(202, json={"templateID": "tid", "buildID": "bid", "public": False,
                                             "names": [body["name"]], "aliases": [body["name"]], "tags": ["default"]})
        if method == "GET" and path.startswith("/templates/tid/files/"):
            h = path.rsplit("/", 1)[1]
            return httpx.Response(201, json={"present": h in self.uploads, "url": f"http://daemon{path}?expires=1&signature=s"})
        if method == "PUT" and path.startswith("/templates/tid/files/"):
            assert "signature=s" in str(request.url)
            self.uploads[path.rsplit("/", 1)[1]] = request.content
            return httpx.Response(200)
        if method == "POST" and path == "/v2/templates/tid/builds/bid":
            self.started = json.loads(request.content)
            return httpx.Response(202)
        if method == "GET" and path == "/templates/tid/builds/bid/status":
            self.polls += 1
            offset = int(request.url.params["logsOffset"])
            logs = [{"timestamp": "2026-01-01T00:00:00Z", "level": "info", "message": m, "step": "1"} for m in ("one", "two")]
            failing = any(s["args"][0] == "fail" for s in self.started["steps"])
            status = "building" if self.polls < 2 else ("error" if failing else "ready")
            body = {"templateID": "tid", "buildID": "bid", "status": status, "logs": [], "logEntries": logs[offset:]}
            if status == "error":
                body["reason"] = {"message": "failed to run command 'fail': exit status 1", "step": "1"}
            return httpx.Response(200, json=body)
        if method == "GET" and path.startswith("/templates/aliases/"):
            name = path.rsplit("/", 1)[1]
            if name == "base":
                return httpx.Response(200, json={"templateID": "base", "public": True})
            return httpx.Response(404, json={"code": 404, "message": "not found"})
        return httpx.Response(404, json={"code": 404, "message": f"no {method} {path}"})


def _template(tmp_path, cmd="echo hi"):
    return Template(file_context_path=_context(tmp_path)).from_base_image().copy("app", "/app").run_cmd(cmd).set_start_cmd(
        "sleep 1000", wait_for_timeout(1000))


def test_sync_build_flow(tmp_path):
    api = FakeTemplateAPI()
    logs = []
    info = Template.build(_template(tmp_path), "web:v1", on_build_logs=logs.append,
                          base_url="http://daemon", api_key="k", transport=httpx.MockTransport(api))
    assert info.template_id == "tid" and info.build_id == "bid"
    assert [str(e) for e in logs] == ["one", "two"]
    assert len(api.uploads) == 1 and api.started["steps"][0]["filesHash"] in api.uploads
    assert api.started["fromImage"] == "e2bdev/base" and api.started["readyCmd"] == "sleep 1"
    # Already uploaded: not sent again.
    api2 = FakeTemplateAPI()
    api2.uploads = dict(api.uploads)
    Template.build(_template(tmp_path), "web", base_url="http://daemon", transport=httpx.MockTransport(api2))
    assert api2.uploads == api.uploads
    with pytest.raises(TemplateBuildError) as err:
        Template.build(_template(tmp_path, "fail"), "web", base_url="http://daemon", transport=httpx.MockTransport(FakeTemplateAPI()))
    assert err.value.step == "1" and "exit status 1" in err.value.message
    assert Template.exists("base", base_url="http://daemon", transport=httpx.MockTransport(api))
    assert not Template.exists("nope", base_url="http://daemon", transport=httpx.MockTransport(api))


def test_async_build_flow(tmp_path):
    async def main():
        api = FakeTemplateAPI()
        logs = []
        info = await AsyncTemplate.build(_template(tmp_path), "web", on_build_logs=logs.append,
                                         base_url="http://daemon", transport=httpx.MockTransport(api))
        assert info.build_id == "bid" and len(logs) == 2
        with pytest.raises(TemplateBuildError):
            await AsyncTemplate.build(_template(tmp_path, "fail"), "web", base_url="http://daemon",
                                      transport=httpx.MockTransport(FakeTemplateAPI()))
        assert await AsyncTemplate.exists("base", base_url="http://daemon", transport=httpx.MockTransport(api))

    asyncio.run(main())


def test_dockerfile_uploads_its_context(tmp_path):
    ctx = _context(tmp_path)
    (ctx / "Dockerfile").write_text("FROM python:3\nCOPY app /app\nCMD python /app/main.py\n")
    api = FakeTemplateAPI()
    Template.build(Template(file_context_path=ctx).from_dockerfile("Dockerfile"), "df",
                   base_url="http://daemon", transport=httpx.MockTransport(api))
    assert "FROM python:3" in api.started["dockerfile"]
    assert api.started["dockerfileContext"] in api.uploads and "fromImage" not in api.started
