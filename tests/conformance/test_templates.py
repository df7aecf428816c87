"""Custom templates through the official, unmodified E2B SDK (Template):
built from code, from a Dockerfile and from an image in a local registry;
a start command serving HTTP that answers the moment a sandbox from the
template exists; a rebuild with one changed step served from the cache;
tags and names; and clear errors (a failing step, an unknown user, a
registry that is down) that leave nothing behind."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from e2b import AsyncTemplate, BuildException, Template, wait_for_port

from ._registry import Registry
from ._util import CLUSTER, routing_headers

# Through a cluster's gateway the build from code runs too (built on the
# template host, published to the chunk store, pulled by the host a
# sandbox lands on); the registry tests need the registry on the host
# that builds, so they are a single host's.
pytestmark = pytest.mark.timeout(300)
single_host = pytest.mark.skipif(CLUSTER, reason="the test registry listens on the test's machine, not in the cluster's network (templates-travel covers the cluster)")


@pytest.fixture(scope="module")
def registry():
    reg = Registry()
    try:
        yield reg
    finally:
        reg.remove()


@pytest.fixture
def name(e2b_env):
    """A template name; the template is deleted after the test."""
    n = f"cf-{uuid.uuid4().hex[:10]}"
    yield n
    httpx.delete(f"{e2b_env['E2B_API_URL']}/templates/{n}", headers={"X-API-KEY": e2b_env["E2B_API_KEY"]}, timeout=30)


def _build(template, name, **kw):
    logs = []
    info = Template.build(template, name, cpu_count=1, memory_mb=1024, on_build_logs=lambda e: logs.append(e.message), **kw)
    return info, logs


def _context(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<h1>from the template</h1>")
    (tmp_path / "site" / "data.txt").write_text("data")
    return tmp_path


def _web_template(ctx, last="echo built > /srv/built.txt"):
    return (
        Template(file_context_path=str(ctx))
        .from_base_image()
        .copy("site/*", "/srv/www/")
        .set_envs({"GREETING": "hello"})
        .set_workdir("/srv")
        .run_cmd("echo $GREETING > greeting.txt")
        .run_cmd(last)
        .set_start_cmd("python3 -m http.server 8000 --directory /srv/www", wait_for_port(8000))
    )


def test_build_from_code_serves_http_at_once(make_sandbox, name, tmp_path, sandbox_url):
    info, logs = _build(_web_template(_context(tmp_path)), name)
    assert info.template_id and info.build_id
    assert any("Template is ready" in m for m in logs), logs
    assert Template.exists(name)
    sbx = make_sandbox(template=name)
    # The start command runs already: no retry, the first request answers.
    r = httpx.get(f"{sandbox_url}/index.html", headers=routing_headers(sbx.sandbox_id, 8000), timeout=10)
    assert r.status_code == 200 and r.text == "<h1>from the template</h1>"
    out = sbx.commands.run("cat greeting.txt built.txt; pwd; whoami").stdout
    assert out == "hello\nbuilt\n/srv\nroot\n"

    # A rebuild that changes only the last step runs only that one (the
    # token keeps it new even on a daemon that ran this test before).
    token = uuid.uuid4().hex[:8]
    info2, logs2 = _build(_web_template(_context_again(tmp_path), f"echo rebuilt {token} > /srv/built.txt"), name)
    assert info2.build_id != info.build_id
    cached = [m for m in logs2 if m.startswith("CACHED [builder")]
    assert len(cached) == 4 and any("4 of 5 steps came from the cache" in m for m in logs2), logs2
    sbx2 = make_sandbox(template=name)
    assert sbx2.commands.run("cat /srv/built.txt").stdout == f"rebuilt {token}\n"
    # The first sandbox keeps its build.
    assert sbx.commands.run("cat /srv/built.txt").stdout == "built\n"


def _context_again(tmp_path):
    return tmp_path  # the same files: the COPY step is cached


@single_host
def test_build_from_dockerfile(make_sandbox, name, tmp_path, registry, sandbox_url):
    ref = registry.push("cellfork/busybox", "1")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "index.html").write_text("dockerfile site")
    dockerfile = f"""FROM {ref}
ARG GREETING=hi
ENV WHO=dockerfile
WORKDIR /www
COPY app/index.html ./
RUN echo "$GREETING $WHO" > /www/who.txt
USER root
"""
    template = (
        Template(file_context_path=str(tmp_path))
        .from_dockerfile(dockerfile)
        .set_start_cmd("httpd -f -p 8081 -h /www", "wget -q -O /dev/null http://127.0.0.1:8081/")
    )
    _build(template, name)
    sbx = make_sandbox(template=name)
    r = httpx.get(f"{sandbox_url}/who.txt", headers=routing_headers(sbx.sandbox_id, 8081), timeout=10)
    assert r.status_code == 200 and r.text == "hi dockerfile\n"
    r = httpx.get(f"{sandbox_url}/index.html", headers=routing_headers(sbx.sandbox_id, 8081), timeout=10)
    assert r.text == "dockerfile site"


@single_host
def test_build_from_registry_image_async(make_sandbox, name, registry):
    ref = registry.push("cellfork/busybox", "2", files={"etc/motd": "from the registry\n"})
    template = (
        AsyncTemplate()
        .from_image(ref)
        .run_cmd("cat /etc/motd > /motd.copy")
        .make_symlink("/motd.copy", "/motd.link")
        .set_user("app")
        .run_cmd("id -un > /tmp/built-by")
    )

    async def build():
        return await AsyncTemplate.build(template, f"{name}:v1", cpu_count=1, memory_mb=512)

    info = asyncio.run(build())
    assert "v1" in info.tags
    sbx = make_sandbox(template=f"{name}:v1")
    out = sbx.commands.run("cat /motd.link /tmp/built-by; id -un").stdout
    assert out == "from the registry\napp\napp\n"
    # Tags.
    assigned = Template.assign_tags(f"{name}:v1", ["stable"])
    assert "stable" in assigned.tags and assigned.build_id == info.build_id
    assert {t.tag for t in Template.get_tags(name)} >= {"v1", "stable"}
    with pytest.raises(Exception):
        Template.assign_tags(f"{name}:v1", ":bad")


@single_host
def test_build_errors_name_the_step(name, registry):
    ref = registry.push("cellfork/busybox", "3")
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image(ref).run_cmd("true").run_cmd("exit 3"), name)
    assert "failed to run command 'exit 3': exit status 3" in str(err.value)
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image(ref).run_cmd("whoami", user="root123"), name)
    assert "failed to run command 'whoami': command failed: unauthenticated: invalid username: 'root123'" in str(err.value)
    # A registry that is down.
    down = Registry()
    ref_down = down.push("cellfork/busybox", "1")
    down.remove()
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image(ref_down), name)
    assert "unreachable" in str(err.value)


def test_exists(e2b_env):
    assert Template.exists("base")
    assert Template.exists("code-interpreter-v1")
    assert not Template.exists(f"nonexistent-{uuid.uuid4()}")
