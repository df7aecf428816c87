"""The dashboard (/dashboard/) in a real headless Chromium (Debian's chromium
and chromium-driver, driven by selenium), against the real test daemon that
scripts/test.sh starts. Sandboxes, snapshots and forks are made through the
API and the official E2B SDK; the test then checks what the page shows
(state, template, age, live CPU and memory, processes, files, the code and
shell box, the snapshot tree, templates, the pool) at desktop and phone
width. Screenshots go to $CELLFORK_ARTIFACTS/dashboard (or pytest's temp
directory) and are printed at the end."""

from __future__ import annotations

import base64
import os
import pathlib
import shutil
import tempfile
import time
from typing import Any, Callable, Iterator

import httpx
import pytest
from e2b_code_interpreter import Sandbox
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: these tests need a running daemon (scripts/test.sh exports it)", pytrace=False)
    return value


@pytest.fixture(scope="module")
def daemon() -> tuple[str, str]:
    return _env("CELLFORK_URL").rstrip("/"), _env("CELLFORK_API_KEY")


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    base = os.environ.get("CELLFORK_ARTIFACTS")
    d = pathlib.Path(base) / "dashboard" if base else tmp_path_factory.mktemp("dashboard-screenshots")
    d.mkdir(parents=True, exist_ok=True)
    yield d
    print(f"\ndashboard screenshots: {d}")


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            pytest.fail(f"{path} is missing: scripts/setup.sh installs chromium and chromium-driver", pytrace=False)
    profile = tempfile.mkdtemp(prefix="cellfork-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS + [f"--user-data-dir={profile}", "--window-size=1280,1000"]:
        opts.add_argument(f)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver: webdriver.Chrome, where: pathlib.Path, name: str) -> None:
    """A full-page screenshot (beyond the viewport)."""
    png = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    (where / f"{name}.png").write_bytes(base64.b64decode(png["data"]))


def wait(driver: webdriver.Chrome, what: str, cond: Callable[[webdriver.Chrome], Any], timeout: float = 20) -> Any:
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(cond)
    except TimeoutException:
        pytest.fail(f"timed out waiting for {what}; page text:\n{driver.find_element(By.TAG_NAME, 'body').text[:2000]}")


def text(driver: webdriver.Chrome) -> str:
    return driver.find_element(By.TAG_NAME, "body").text


def no_overflow(driver: webdriver.Chrome) -> bool:
    """Nothing on the page is wider than the screen (no sideways scrolling)."""
    return driver.execute_script("const e = document.documentElement; return e.scrollWidth <= e.clientWidth")


@pytest.fixture(scope="module")
def lineage(daemon: tuple[str, str]) -> Iterator[dict[str, str]]:
    """A sandbox with a file, a background process, two snapshots, a
    rollback to the first and a fork child."""
    url, key = daemon
    api = httpx.Client(base_url=url, headers={"X-API-KEY": key}, timeout=120)
    sbx = Sandbox.create(timeout=300, metadata={"test": "dashboard"})
    kids: list[str] = []
    snaps: list[str] = []
    try:
        sbx.files.write("/home/user/hello.txt", "hello from the dashboard test\n")
        sbx.commands.run("sleep 600", background=True)
        sbx.run_code("x = 1")
        s1 = api.post(f"/sandboxes/{sbx.sandbox_id}/snapshots", json={"name": f"first-{sbx.sandbox_id}"}).json()["snapshotID"]
        snaps.append(s1)
        sbx.run_code("x = 2")
        s2 = api.post(f"/sandboxes/{sbx.sandbox_id}/snapshots", json={}).json()["snapshotID"]
        snaps.append(s2)
        assert api.post(f"/sandboxes/{sbx.sandbox_id}/rollback", json={"snapshotID": s1}).status_code == 200
        fork = api.post(f"/sandboxes/{sbx.sandbox_id}/fork", json={"count": 1}).json()
        kids = [f["sandbox"]["sandboxID"] for f in fork if f.get("sandbox")]
        assert len(kids) == 1
        yield {"sandbox": sbx.sandbox_id, "child": kids[0], "s1": s1, "s2": s2}
    finally:
        for k in kids:
            api.delete(f"/sandboxes/{k}")
        sbx.kill()
        for s in snaps:
            api.delete(f"/snapshots/{s}")


@pytest.mark.timeout(240)
def test_dashboard(daemon: tuple[str, str], browser: webdriver.Chrome, lineage: dict[str, str], shots: pathlib.Path) -> None:
    url, key = daemon
    d, sid, child = browser, lineage["sandbox"], lineage["child"]

    # The page is static and strict about what it runs.
    r = httpx.get(url + "/dashboard/")
    assert r.status_code == 200 and "script-src 'self'" in r.headers["Content-Security-Policy"]
    assert httpx.get(url + "/dashboard", follow_redirects=False).status_code == 301

    d.get(url + "/dashboard/")
    wait(d, "the sign-in form", lambda d: d.find_element(By.ID, "signin").is_displayed())
    shot(d, shots, "01-signin")
    d.find_element(By.ID, "key").send_keys("not-the-key")
    d.find_element(By.CSS_SELECTOR, "#signin-form button").click()
    wait(d, "the refusal", lambda d: "not valid" in d.find_element(By.ID, "signin-error").text)
    key_input = d.find_element(By.ID, "key")
    key_input.clear()
    key_input.send_keys(key)
    d.find_element(By.CSS_SELECTOR, "#signin-form button").click()

    # Sandboxes: state, template, age, live CPU and memory.
    row = wait(d, "the sandbox's row", lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-id="{sid}"]'))
    wait(d, "live usage", lambda d: "%" in d.find_element(By.CSS_SELECTOR, f'tr[data-id="{sid}"]').text
         and "MiB" in d.find_element(By.CSS_SELECTOR, f'tr[data-id="{sid}"]').text)
    cells = [c.text for c in d.find_element(By.CSS_SELECTOR, f'tr[data-id="{sid}"]').find_elements(By.TAG_NAME, "td")]
    assert cells[1] == "running" and cells[2] == "code-interpreter-v1", cells
    assert d.find_elements(By.CSS_SELECTOR, f'tr[data-id="{child}"]')
    shot(d, shots, "02-sandboxes")

    # One sandbox: details, usage over time, processes, files, run box, tree.
    d.find_element(By.CSS_SELECTOR, f'tr[data-id="{sid}"]').click()
    wait(d, "the sandbox page", lambda d: sid in d.find_element(By.CSS_SELECTOR, "#view h1").text)
    wait(d, "the background process", lambda d: "sleep 600" in text(d))
    wait(d, "the file list", lambda d: "hello.txt" in text(d))
    d.find_element(By.XPATH, "//button[text()='hello.txt']").click()
    wait(d, "the file's content", lambda d: "hello from the dashboard test" in text(d))
    code = d.find_element(By.CSS_SELECTOR, "textarea[aria-label=code]")
    code.clear()
    code.send_keys("print(6 * 7)\nx")
    d.find_element(By.XPATH, "//button[text()='Run']").click()
    wait(d, "the code's output", lambda d: d.find_element(By.CSS_SELECTOR, "pre.run").text == "42\n1")  # rolled back: x = 1
    Select(d.find_element(By.CSS_SELECTOR, "select[aria-label=language]")).select_by_value("bash")
    code.clear()
    code.send_keys("echo hello-$((40 + 2)); echo to-stderr >&2")
    d.find_element(By.XPATH, "//button[text()='Run']").click()
    wait(d, "the command's output", lambda d: "exit code 0" in d.find_element(By.CSS_SELECTOR, "pre.run").text)
    # stdout and stderr are two pipes: the order in which their lines arrive is not defined.
    words = d.find_element(By.CSS_SELECTOR, "pre.run").text.split()
    assert sorted(words[:2]) == ["hello-42", "to-stderr"] and words[2:] == ["exit", "code", "0"], words
    # The usage chart draws a line through several samples.
    wait(d, "the usage chart", lambda d: d.execute_script(
        "const p = document.querySelector('.chart path.line'); return p && p.getAttribute('d').split('L').length >= 3"))
    # The tree: both snapshots, this sandbox (marked) and its fork child.
    for node in (lineage["s1"], lineage["s2"], sid, child):
        assert d.find_elements(By.CSS_SELECTOR, f'.graph g[data-id="{node}"]'), f"{node} is not in the tree"
    assert "here" in d.find_element(By.CSS_SELECTOR, f'.graph g[data-id="{sid}"]').get_attribute("class")
    assert d.find_elements(By.CSS_SELECTOR, ".graph path.edge.fork"), "the fork edge is not drawn"
    shot(d, shots, "03-sandbox")

    # Snapshots: the forest and the table.
    d.find_element(By.LINK_TEXT, "Snapshots").click()
    wait(d, "the snapshot table", lambda d: lineage["s2"] in text(d))
    assert d.find_elements(By.CSS_SELECTOR, f'.graph g[data-id="{lineage["s1"]}"]')

    # Each snapshot's upload to the chunk store (the test daemon's default
    # file:// store), shown once it is done (the page is loaded again).
    def uploaded(d: webdriver.Chrome) -> bool:
        d.find_element(By.LINK_TEXT, "Snapshots").click()
        time.sleep(0.3)
        try:
            return any(td.text == "uploaded" for td in d.find_elements(By.CSS_SELECTOR, "td.upload"))
        except StaleElementReferenceException:
            return False  # drawn again meanwhile
    wait(d, "an uploaded snapshot", uploaded)
    shot(d, shots, "04-snapshots")

    # Templates: the templates API's list, or (without one) the built-ins.
    d.find_element(By.LINK_TEXT, "Templates").click()
    wait(d, "the templates", lambda d: "base" in d.find_element(By.ID, "view").text)
    shot(d, shots, "05-templates")

    # Host: capacity, pool, standbys, starts.
    d.find_element(By.LINK_TEXT, "Host").click()
    wait(d, "the host's levels", lambda d: "Ready: base" in text(d) and "Shells" in text(d) and "slots" in text(d))
    shot(d, shots, "06-host")

    # Phone width (a 390x844 phone, as the browser's device emulation
    # sets it): nothing wider than the screen.
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    assert d.execute_script("return window.innerWidth") == 390
    d.get(url + "/dashboard/#/")
    wait(d, "the sandboxes at phone width", lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-id="{sid}"]'))
    assert no_overflow(d), "the sandbox list is wider than a phone"
    shot(d, shots, "07-phone-sandboxes")
    d.get(url + f"/dashboard/#/sandbox/{sid}")
    wait(d, "the sandbox page at phone width", lambda d: "hello.txt" in text(d) and d.find_elements(By.CSS_SELECTOR, ".graph svg"))
    assert no_overflow(d), "the sandbox page is wider than a phone"
    shot(d, shots, "08-phone-sandbox")
    d.get(url + "/dashboard/#/host")
    wait(d, "the host page at phone width", lambda d: "Shells" in text(d))
    assert no_overflow(d), "the host page is wider than a phone"
    shot(d, shots, "09-phone-host")
    d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    # Nothing the page did broke its policy or failed, but the probes for
    # APIs a daemon may lack (templates, a gateway's hosts).
    errors = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"
              and not any(p in e["message"] for p in ("/templates", "/hosts", "401 (Unauthorized)"))]
    assert not errors, errors

    # Signing out forgets the key.
    d.find_element(By.ID, "signout").click()
    wait(d, "the sign-in form again", lambda d: d.find_element(By.ID, "signin").is_displayed())
    assert d.execute_script("return sessionStorage.length + localStorage.length") == 0
