"""End to end: `attnprobe app` on loopback, driven by headless Debian Chromium (selenium +
chromedriver from apt; no browser is downloaded).

Screenshots of every page go to a temporary folder (printed at the end of the module), so a test run
never modifies tracked files. To refresh the tracked ones in docs/screenshots/, run it with
``ATTNPROBE_UPDATE_SCREENSHOTS=1``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from support.appdata import capture_dirs
from support.paths import ROOT

from attnprobe.results.result import CaptureResult

CHROMIUM = os.environ.get("ATTNPROBE_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("ATTNPROBE_CHROMEDRIVER", "/usr/bin/chromedriver")
TRACKED_SHOTS = ROOT / "docs" / "screenshots"
UPDATE_SHOTS = os.environ.get("ATTNPROBE_UPDATE_SCREENSHOTS") == "1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(DRIVER).exists()),
                       reason="needs Debian chromium + chromium-driver (.ci/app_setup.sh)"),
]
webdriver = pytest.importorskip("selenium.webdriver")
pytest.importorskip("streamlit")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(bundled_app_data, tmp_path_factory):
    port = _free_port()
    log = open(tmp_path_factory.mktemp("app-log") / "app.log", "w+")  # under pytest's basetemp, not /tmp
    proc = subprocess.Popen([sys.executable, "-m", "attnprobe", "app", "--data", str(bundled_app_data), "--port",
                             str(port)], stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT),
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read().strip() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            break
    else:
        proc.terminate()
        pytest.fail("app did not start: " + Path(log.name).read_text()[-2000:])
    if proc.poll() is not None:
        pytest.fail("app exited: " + Path(log.name).read_text()[-2000:])
    yield url
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
    log.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where screenshots go: docs/screenshots/ only with ATTNPROBE_UPDATE_SCREENSHOTS=1."""
    folder = TRACKED_SHOTS if UPDATE_SHOTS else tmp_path_factory.mktemp("screenshots")
    yield folder
    print(f"\nscreenshots: {folder}")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium-manager fetch anything
    profile = tmp_path_factory.mktemp("chromium-profile")
    opts = Options()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1500,1900", "--disable-dev-shm-usage"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    drv.set_page_load_timeout(120)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


JS_PLOTS = """
return Array.from(document.querySelectorAll('.js-plotly-plot')).map(function (g) {
  return (g._fullData || []).map(function (t) {
    return {type: t.type, name: t.name || '', hover: t.hovertemplate || '',
            x: t.x ? Array.from(t.x, Number) : [], y: t.y ? Array.from(t.y, Number) : [],
            z: t.z ? Array.from(t.z).map(function (r) { return Array.from(r); }) : null};
  });
});"""


def wait_for(drv, pred, timeout=90, what="condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = pred()
            if last:
                return last
        except Exception as exc:  # the DOM changes under us while Streamlit reruns
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def idle(drv):
    """Streamlit finished running the script (no 'running' status widget)."""
    time.sleep(0.8)
    wait_for(drv, lambda: not drv.find_elements("css selector", '[data-testid="stStatusWidget"] *')
             or "Running" not in drv.find_element("css selector", '[data-testid="stStatusWidget"]').text,
             what="script run to finish")
    time.sleep(0.5)


def plots(drv):
    return drv.execute_script(JS_PLOTS)


def heatmap_plot(drv):
    for p in plots(drv):
        if len(p) == 2 and all(t["type"] == "heatmap" for t in p) and p[0]["name"] == "reasoning":
            return p
    return None


def strip_plot(drv):
    for p in plots(drv):
        if p and p[0]["type"] == "bar" and "token %{x}" in p[0]["hover"]:
            return p
    return None


def strip_vector(p, n):
    out = np.zeros(n)
    for t in p:
        out[np.asarray(t["x"], dtype=int)] = t["y"]
    return out


def shot(drv, folder: Path, name: str):
    folder.mkdir(parents=True, exist_ok=True)
    drv.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.5)
    assert drv.save_screenshot(str(folder / name)), name


def test_browser_heatmap_and_token_selection(server, browser, bundled_app_data, shots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    folder = max(capture_dirs(bundled_app_data), key=lambda f: CaptureResult.load(f).num_turns)
    rel = folder.relative_to(bundled_app_data).as_posix()
    res = CaptureResult.load(folder)
    browser.get(f"{server}/?page=Trajectory&run={rel}")
    hm = wait_for(browser, lambda: heatmap_plot(browser), what="turn heatmap")
    assert len(hm[0]["z"]) == res.num_turns
    # the heatmap really rendered: plotly drew its heatmap layer
    wait_for(browser, lambda: browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .hm, .js-plotly-plot image"),
             what="drawn heatmap")
    idle(browser)
    first = strip_vector(wait_for(browser, lambda: strip_plot(browser), what="token strip"), len(res.input_ids))
    steps = [i for i, q in enumerate(res.queries) if q.kind == "reasoning"]
    np.testing.assert_allclose(first, res.token_attention[steps[-1]], rtol=1e-5, atol=1e-9)  # default: latest step
    shot(browser, shots, "trajectory.png")

    # choose another reasoning-start token in the selectbox: the strip must follow
    box = next(b for b in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stSelectbox"]')
               if "query token" in b.text)
    target = steps[len(steps) // 2]
    q = res.queries[target]
    box.find_element(By.CSS_SELECTOR, "input").click()
    time.sleep(0.5)
    inp = box.find_element(By.CSS_SELECTOR, "input")
    inp.send_keys(f"token {q.position} ")
    time.sleep(0.8)
    inp.send_keys(Keys.ENTER)

    def changed():
        p = strip_plot(browser)
        if not p:
            return None
        v = strip_vector(p, len(res.input_ids))
        return (v,) if not np.allclose(v, first) else None

    (new,) = wait_for(browser, changed, what="token strip to update")
    np.testing.assert_allclose(new, res.token_attention[target], rtol=1e-5, atol=1e-9)
    idle(browser)
    shot(browser, shots, "trajectory_token.png")


@pytest.mark.parametrize("page", ["Decay", "Framings", "Models"])
def test_browser_pages(server, browser, shots, page):
    browser.get(f"{server}/?page={page}")
    wait_for(browser, lambda: plots(browser), what=f"{page} figure")
    idle(browser)
    assert not browser.find_elements("css selector", '[data-testid="stException"]')
    shot(browser, shots, f"{page.lower()}.png")
