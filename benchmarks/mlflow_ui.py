"""MLflow's UI on a raydg store, checked in a real headless browser, with screenshots.

By default the script makes a store: in a temporary folder it runs
``raydg run digits-style --rounds 2`` into ``sqlite:///TMP/mlflow.db`` (about a minute) and
parses the experiment id from the UI link raydg prints last. ``--tracking-uri`` (with
``--experiment``) uses an existing store instead. It then starts ``mlflow server`` on that store
(a free port, its own process group, stopped at the end even on error) and, in fresh browser
contexts (empty localStorage, as a first visit):

* ``runs.png``: raydg's link (``?workflowType=machine_learning``); checks that the runs table
  shows the parent run and that the GenAI overview (traces) is not what opens;
* ``default.png``: the same experiment without ``workflowType``: what MLflow opens by default;
* ``child-metrics.png``: a child run (a federation) on its Model metrics tab, the whole page;
  the charts' sections and titles are printed in the order the page shows them; checks that
  the first section is the accuracy and loss curves (``raydg.tracking.tracker.CURVES``).

Screenshots go to ``--out`` (default ``mlflow-ui-screens/``). Exit 1 if a check fails.

Install (once): Playwright's Python package (the ``ui`` extra) and Debian's Chromium; no
``playwright install``, the script drives the system browser (``--chromium PATH``)::

    apt-get install -y chromium
    .venv/bin/pip install -c constraints.txt -e '.[ui]'

Run:  python benchmarks/mlflow_ui.py [--out mlflow-ui-screens]
                                     [--tracking-uri sqlite:///mlflow.db --experiment digits-style]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from raydg.tracking.tracker import CURVES

BIN = Path(sys.executable).parent
LINK = re.compile(r"http://[\w.-]+:\d+/#/experiments/(\d+)\?workflowType=machine_learning")
CHROMIUMS = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "chromium", "chromium-browser",
             "google-chrome")
BROWSER_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking"]
TIMEOUT_MS = 120_000  # the machine may be busy: the UI's first load can take tens of seconds
VIEWPORT = {"width": 1400, "height": 900}

# Sections and chart cards of a run's metrics tab, in document order (= the order shown).
CHARTS_JS = """() => [...document.querySelectorAll(
    '[data-testid=experiment-view-compare-runs-section-header],'
    + ' [data-testid=experiment-view-compare-runs-card]')].map(e => {
  if (e.matches('[data-testid=experiment-view-compare-runs-section-header]'))
    return {section: [...e.firstElementChild.children].slice(0, 2).map(d => d.textContent)
      .join(' ')};
  const h = e.querySelector('h4');
  const kind = e.querySelector('.trace.bars') ? 'bar'
    : e.querySelector('.trace.scatter') ? 'line' : 'not drawn';
  return {title: h ? h.textContent : '?', key: h ? h.title : '?', kind: kind};
})"""
DRAWN_JS = """() => [...document.querySelectorAll(
  '[data-testid=experiment-view-compare-runs-card]')].every(c => c.querySelector('.trace'))"""
# Space the page's scrolling panes still hide (the metrics tab lazily draws off-screen charts).
HIDDEN_JS = """() => Math.max(0, ...[...document.querySelectorAll('*')]
  .filter(e => /auto|scroll/.test(getComputedStyle(e).overflowY))
  .map(e => e.scrollHeight - e.clientHeight))"""


def make_store(folder: Path) -> tuple[str, str]:
    """Run raydg into a new SQLite store in ``folder``: (tracking URI, the UI link printed)."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    cmd = [str(BIN / "raydg"), "run", "digits-style", "--rounds", "2", "--tracking-uri", uri,
           "--address", "local"]
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    links = [m[0] for m in LINK.finditer(output)]
    if done.returncode != 0 or not links:
        print(output[-3000:], file=sys.stderr)
        sys.exit(f"raydg run failed (exit {done.returncode}) or printed no UI link")
    link = links[-1]
    print(f"raydg run: {time.perf_counter() - start:.0f} s; it printed {link}")
    return uri, link


def existing_store(uri: str, experiment: str) -> str:
    """The link raydg prints for ``experiment`` in the store ``uri``."""
    from mlflow import MlflowClient

    found = MlflowClient(uri).get_experiment_by_name(experiment)
    if found is None:
        sys.exit(f"no experiment {experiment!r} in {uri}")
    return f"http://127.0.0.1:5000/#/experiments/{found.experiment_id}?workflowType=machine_learning"


def parent_and_child(uri: str, experiment_id: str) -> tuple[str, str, str]:
    """The latest parent run's name, and one of its child runs: (parent name, child id, name)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([experiment_id], order_by=["attributes.start_time DESC"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    if not parents:
        sys.exit(f"no parent run in experiment {experiment_id} of {uri}")
    parent = parents[0]
    children = sorted((r for r in runs
                       if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id),
                      key=lambda r: r.info.run_name)
    if not children:
        sys.exit(f"parent run {parent.info.run_name!r} has no child run")
    return parent.info.run_name, children[0].info.run_id, children[0].info.run_name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(uri: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``mlflow server`` on ``uri`` in its own process group, once ``/health`` answers."""
    cmd = [str(BIN / "mlflow"), "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    print("$", " ".join(cmd), flush=True)
    with log.open("wb") as out:
        server = subprocess.Popen(cmd, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"mlflow server exited {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    stop_server(server)
    sys.exit(f"mlflow server did not answer /health in 180 s:\n{log.read_text()[-3000:]}")


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def find_chromium(given: str | None) -> str:
    for name in (given,) if given else CHROMIUMS:
        path = shutil.which(name)
        if path:
            return path
    sys.exit(f"no Chromium found ({given or ', '.join(CHROMIUMS)}): apt-get install -y chromium")


def fresh_page(browser: Any) -> Any:
    """A page in a new browser context: no localStorage, as a first visit."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(TIMEOUT_MS)
    return context.new_page()


def check_runs(browser: Any, url: str, parent: str, path: Path) -> list[str]:
    """Open raydg's link; the problems found (none: the runs table with the parent run)."""
    page = fresh_page(browser)
    page.goto(url)
    problems = []
    try:
        page.get_by_text(parent, exact=True).first.wait_for()
    except Exception:  # Playwright's TimeoutError: checked below, after the screenshot
        problems.append(f"the parent run {parent!r} did not show in {TIMEOUT_MS // 1000} s")
    page.wait_for_timeout(1500)
    page.screenshot(path=path, full_page=True)
    print(f"{path}: raydg's link opened {page.url}")
    if not page.get_by_test_id("sort-header-Run Name").is_visible():
        problems.append("no runs table (no 'Run Name' column header)")
    if re.search(r"#/experiments/\d+/(overview|traces)", page.url):
        problems.append(f"the GenAI overview/traces page opened: {page.url}")
    if page.get_by_text("Token Usage").count():
        problems.append("the GenAI overview (Token Usage) is on the page")
    page.context.close()
    return problems


def screenshot_default(browser: Any, url: str, path: Path) -> None:
    """The experiment as MLflow opens it by default (no ``workflowType`` in the URL)."""
    page = fresh_page(browser)
    page.goto(url)
    page.wait_for_function(r"() => /#\/experiments\/\d+\/\w+/.test(location.hash)")
    page.wait_for_timeout(6000)  # its charts or table settle
    page.screenshot(path=path, full_page=True)
    view = "GenAI overview" if "/overview" in page.url else "another view"
    print(f"{path}: without workflowType MLflow opened {page.url} ({view})")
    page.context.close()


def show_whole_page(page: Any, limit: int = 20_000) -> None:
    """Grow the viewport until no pane scrolls, so every chart is drawn and captured."""
    for _ in range(8):
        hidden = page.evaluate(HIDDEN_JS)
        height = page.viewport_size["height"]
        if hidden <= 0 or height >= limit:
            return
        page.set_viewport_size({"width": VIEWPORT["width"], "height": min(limit, height + hidden)})
        page.wait_for_timeout(1500)


def child_metrics(browser: Any, url: str, path: Path) -> list[dict[str, str]]:
    """A child run's Model metrics tab, whole: its sections and charts in the order shown."""
    page = fresh_page(browser)
    page.goto(url)
    page.get_by_test_id("experiment-view-compare-runs-card").first.wait_for()
    close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')
    if close.count() and close.first.is_visible():
        close.first.click()  # the assistant panel opens by itself on a first visit
    show_whole_page(page)
    page.wait_for_function(DRAWN_JS)
    page.wait_for_timeout(1000)
    page.screenshot(path=path, full_page=True)
    print(f"{path}: {page.url}")
    shown = page.evaluate(CHARTS_JS)
    page.context.close()
    return shown


def print_charts(shown: list[dict[str, str]]) -> None:
    number = 0
    for item in shown:
        if "section" in item:
            print(f"  section {item['section']}")
        else:
            number += 1
            print(f"    {number:2d}. {item['title']:<22} {item['kind']:<5} ({item['key']})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("mlflow-ui-screens"))
    parser.add_argument("--tracking-uri", help="an existing store [default: make one]")
    parser.add_argument("--experiment", default="digits-style",
                        help="the experiment of --tracking-uri [default: digits-style]")
    parser.add_argument("--chromium", help="the browser binary [default: the system Chromium]")
    args = parser.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("Playwright missing: pip install -c constraints.txt -e '.[ui]'")
    chromium = find_chromium(args.chromium)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="raydg-ui-") as tmp:
        folder = Path(tmp)
        if args.tracking_uri:
            uri, link = args.tracking_uri, existing_store(args.tracking_uri, args.experiment)
        else:
            uri, link = make_store(folder)
        experiment_id = LINK.search(link)[1]
        parent, child_id, child = parent_and_child(uri, experiment_id)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = start_server(uri, port, folder / "server.log")
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, headless=True,
                                                     args=BROWSER_ARGS)
                runs_url = re.sub(r"^http://[\w.-]+:\d+", base, link)
                problems = check_runs(browser, runs_url, parent, args.out / "runs.png")
                screenshot_default(browser, runs_url.split("?")[0], args.out / "default.png")
                metrics_url = (f"{base}/#/experiments/{experiment_id}/runs/{child_id}"
                               "/model-metrics?workflowType=machine_learning")
                shown = child_metrics(browser, metrics_url, args.out / "child-metrics.png")
                browser.close()
        finally:
            stop_server(server)
    print(f"child run {child!r}: its Model metrics tab, top to bottom:")
    print_charts(shown)
    if not any("title" in item for item in shown):
        problems.append("the child run's metrics tab shows no chart")
    first = next((item["section"] for item in shown if "section" in item), "")
    if not first.startswith(CURVES):  # raydg logs the curves under a prefix that sorts first
        problems.append(f"the child run's metrics tab opens on section {first!r}, not on "
                        f"{CURVES!r}")
    print(f"done in {time.perf_counter() - start:.0f} s")
    for problem in problems:
        print("FAILED:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
