"""Custom templates with the SDK's Template and AsyncTemplate against a
real daemon: build from the built-in base with files and a start command,
create sandboxes from it, list, check and delete."""

from __future__ import annotations

import uuid

import httpx
import pytest

from cellfork import AsyncTemplate, Template, TemplateBuildError, wait_for_port


def _template(tmp_path, marker):
    (tmp_path / "www").mkdir(exist_ok=True)
    (tmp_path / "www" / "index.html").write_text(marker)
    return (
        Template(file_context_path=tmp_path)
        .from_base_image()
        .copy("www", "/srv/www")
        .set_envs({"MARKER": marker})
        .run_cmd("echo $MARKER > /srv/marker")
        .set_start_cmd("python3 -m http.server 8000 --directory /srv/www", wait_for_port(8000))
    )


def test_build_create_delete(tmp_path, client_kwargs, new_sandbox, cellfork_url):
    name = f"sdk-{uuid.uuid4().hex[:8]}"
    marker = uuid.uuid4().hex
    logs = []
    try:
        info = Template.build(_template(tmp_path, marker), name, on_build_logs=logs.append, **client_kwargs)
        assert info.name == name and any("Template is ready" in str(e) for e in logs)
        assert Template.exists(name, **client_kwargs) and Template.exists("base", **client_kwargs)
        assert name in [n for t in Template.list(**client_kwargs) for n in t.names]
        sb = new_sandbox(template=name)
        r = httpx.get(f"{cellfork_url}/index.html", headers={"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "8000"})
        assert r.status_code == 200 and r.text == marker
        assert sb.commands.run("cat /srv/marker").stdout == marker + "\n"
    finally:
        assert Template.delete(name, **client_kwargs)
    assert not Template.exists(name, **client_kwargs)
    assert not Template.delete(name, **client_kwargs)


def test_failed_build_names_the_step(client_kwargs):
    name = f"sdk-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(TemplateBuildError) as err:
            Template.build(Template().from_base_image().run_cmd("true").run_cmd("exit 4"), name, **client_kwargs)
        assert err.value.step == "2" and "exit status 4" in err.value.message
    finally:
        Template.delete(name, **client_kwargs)


async def test_async_twin(tmp_path, client_kwargs):
    name = f"sdk-{uuid.uuid4().hex[:8]}"
    t = AsyncTemplate().from_template("base").run_cmd(f"echo {uuid.uuid4().hex} > /tmp/x")
    try:
        info = await AsyncTemplate.build(t, f"{name}:v1", **client_kwargs)
        assert "v1" in info.tags
        assert await AsyncTemplate.exists(name, **client_kwargs)
        assert "v1" in await AsyncTemplate.get_tags(name, **client_kwargs)
    finally:
        assert await AsyncTemplate.delete(name, **client_kwargs)
