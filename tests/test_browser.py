"""Every lesson in JupyterLab in a real browser (headless Chromium driven by Playwright).

One JupyterLab server from the course's environment (where the course is installed) listens on a
free localhost port with token auth and opens no browser of its own; its root is a temporary
folder outside the checkout, so each lesson's setup cell takes mlexp from the installed package. Its environment sets NBGRADER_EXECUTION=autograde, so every
kernel it starts runs each lesson at grading size (experiments at a token size, as under the
grader; see "Grading time" in the design notes): the whole test takes a few minutes, not the
lessons' full run time. Each lesson is opened as its all-correct demo student (the student
notebook with every exercise answered, from autograder/demo/), because a fresh lesson stops by
design at its first unanswered exercise. For each lesson the test clicks Run > Run All Cells,
waits for the kernel, saves, and checks that every code cell ran and none shows an error, both
in the page and in the saved file. In lesson 04 it moves the "layers" slider of the cache
calculator with the keyboard and waits for the widget's printed report to change. It checks
that nbgrader's server and lab extensions are enabled and that its "Validate" button and
"Nbgrader" menu are in the page. A screenshot of each lesson goes to
artifacts/screenshots/<id>.png.

Needs Debian's Chromium (/usr/bin/chromium, or MLEXP_CHROMIUM; `apt-get install chromium`) and
Playwright's Python package, which the test extra installs (`make test`); Playwright's own browser
download is never used. Without them the test skips, unless MLEXP_REQUIRE_BROWSER=1 (set by .ci/run) makes it fail.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("MLEXP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LESSON_TIMEOUT_S = 600
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _require_browser():
    """Skip (or fail under MLEXP_REQUIRE_BROWSER=1) when Chromium or Playwright is missing."""
    missing = []
    if not Path(CHROMIUM).is_file():
        missing.append(f"Chromium ({CHROMIUM}; install Debian's package: apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright's Python package (it comes with the test extra: `make test`, "
                       "or `.venv/bin/pip install -e '.[lab,check]' -e './autograder[test]'`)")
    if missing:
        reason = "browser test needs " + " and ".join(missing)
        if os.environ.get("MLEXP_REQUIRE_BROWSER") == "1":
            pytest.fail(reason + " (MLEXP_REQUIRE_BROWSER=1)")
        pytest.skip(reason)


def _all_correct_notebooks() -> dict:
    """lesson id -> the demo notebook of its all-correct student (every exercise answered)."""
    from autograder.publishing.demo import DEMO_DIR, load_catalog

    found = {}
    for lesson_id, cat in load_catalog().items():
        student = next(s for s, spec in cat["students"].items() if spec.get("from_solution"))
        found[lesson_id] = DEMO_DIR / "submissions" / student / lesson_id / cat["notebook"]
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A running JupyterLab: its base URL, token, root folder and environment."""

    def __init__(self, root: Path, env: dict, port: int, token: str, proc):
        self.root, self.env, self.port, self.token, self.proc = root, env, port, token, proc
        self.base = f"http://127.0.0.1:{port}"

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self):
        for kernel in self.api("/api/kernels"):
            self.api(f"/api/kernels/{kernel['id']}", method="DELETE")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    _require_browser()
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "course"
    for lesson_id, nb in _all_correct_notebooks().items():
        (root / lesson_id).mkdir(parents=True)
        shutil.copy(nb, root / lesson_id / nb.name)
    token, port = uuid.uuid4().hex, _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "NBGRADER"))}
    env.update(NBGRADER_EXECUTION="autograde", HOME=str(tmp / "home"), IPYTHONDIR=str(tmp / "ipython"),
               JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"), JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    # No "official Jupyter news?" toast over the screenshots (the same as `jupyter labextension disable`).
    (tmp / "config" / "labconfig").mkdir(parents=True)
    (tmp / "config" / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    log = open(tmp / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [str(BIN / "jupyter-lab"), "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None",
         *(["--allow-root"] if os.geteuid() == 0 else [])],   # CI containers often run as root
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Lab(root, env, port, token, proc)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                server.api("/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start; log:\n{(tmp / 'jupyterlab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser_page(lab, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    context = pw.chromium.launch_persistent_context(
        str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
        args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()
        pw.stop()


def test_nbgrader_extensions_enabled(lab):
    """nbgrader's assignment tools: server extensions and the JupyterLab extension are enabled."""
    def listing(*args):
        out = subprocess.run([str(BIN / "jupyter"), *args], env=lab.env, capture_output=True, text=True,
                             timeout=120)
        return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)

    server = listing("server", "extension", "list")
    for ext in ("validate_assignment", "assignment_list", "formgrader"):
        assert re.search(rf"nbgrader\.server_extensions\.{ext}\s+enabled", server), server
    labext = listing("labextension", "list")
    assert re.search(r"@jupyter/nbgrader v\S+ enabled\s+OK", labext), labext
    assert re.search(r"@jupyter-widgets/jupyterlab-manager v\S+ enabled\s+OK", labext), labext


# In-page probe: every code cell's prompt, and the outputs that show a Python traceback.
STATE_JS = """() => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  if (!nb) return null;
  const prompts = [...nb.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent.trim());
  const errors = [...nb.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
    .map(e => e.textContent).filter(t => /Traceback|Error:|Exception:/.test(t)).map(t => t.slice(-600));
  const ind = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
  return {prompts, errors, status: ind ? ind.getAttribute('data-status') : null};
}"""


IDLE_JS = """() => { const i = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
  return i && i.getAttribute('data-status') === 'idle'; }"""


def _open_notebook(page, lab, rel: str):
    """Open ``rel`` in a fresh workspace and wait until its kernel has started and is idle."""
    page.goto(f"{lab.base}/lab/tree/{rel}?reset&token={lab.token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=120_000)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        _accept_kernel_dialog(page)
        sessions = [s for s in lab.api("/api/sessions") if s["path"].endswith(rel)]
        state = page.evaluate(STATE_JS)
        if sessions and sessions[0]["kernel"]["execution_state"] == "idle" and state and state["status"] == "idle":
            return
        time.sleep(1.0)
    pytest.fail(f"the kernel of {rel} did not start within 180 s")


def _accept_kernel_dialog(page):
    """Accept JupyterLab's "Select Kernel" dialog (default: the notebook's Python 3) if it is up."""
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    if dialog.count():
        dialog.locator(".jp-mod-accept").click()


def _menu(page, top: str, item: str):
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).first.click()


def _run_all(page, timeout_s: float) -> dict:
    """Run > Run All Cells, then wait until no cell is queued or running and the kernel is idle."""
    _menu(page, "Run", "Run All Cells")
    deadline, state, quiet = time.monotonic() + timeout_s, None, 0
    while time.monotonic() < deadline:
        time.sleep(1.0)
        _accept_kernel_dialog(page)
        state = page.evaluate(STATE_JS)
        busy = state is None or state["status"] != "idle" or any("*" in p for p in state["prompts"])
        quiet = 0 if busy else quiet + 1
        if quiet >= 3:   # idle for three polls in a row: the queue is empty
            return state
    pytest.fail(f"cells still running after {timeout_s:.0f} s: {state}")


def _save_and_read(page, lab, rel: str):
    path = lab.root / rel
    before = path.stat().st_mtime_ns
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while path.stat().st_mtime_ns == before and time.monotonic() < deadline:
        time.sleep(0.3)
    assert path.stat().st_mtime_ns != before, "the notebook was not saved"
    while True:   # the save may still be writing the file when its time changes
        try:
            return nbformat.read(path, as_version=4)
        except ValueError:   # nbformat.reader.NotJSONError, as JSON cut short reads
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _check_ran_without_errors(lesson_id: str, state: dict, nb):
    assert not state["errors"], f"{lesson_id}: cells show errors in the page: {state['errors']}"
    assert state["prompts"] and all(re.fullmatch(r"\[\d+\]:", p) for p in state["prompts"]), \
        f"{lesson_id}: not every code cell ran: {state['prompts']}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [(i, o.ename, o.evalue) for i, c in enumerate(code) for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{lesson_id}: error outputs in the saved notebook: {errors}"
    assert all(c.execution_count for c in code), f"{lesson_id}: the saved notebook has unexecuted code cells"


def _nbgrader_tools_in_page(page):
    assert page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Nbgrader$")).count() == 1, \
        "JupyterLab shows no Nbgrader menu: is nbgrader's labextension enabled?"
    toolbar = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar")
    assert toolbar.get_by_text("Validate", exact=True).count() >= 1, "no nbgrader Validate button in the notebook toolbar"


def _slide_and_see_the_report_change(page, lesson_id):
    """Lesson 04: move the cache calculator's "layers" slider; its printed report must change."""
    slider = page.locator(".widget-slider", has=page.locator(".widget-label", has_text=re.compile("^layers$"))).first
    slider.scroll_into_view_if_needed()
    report = page.locator(".widget-output").filter(has_text="attention layers:").first
    report.wait_for(timeout=30_000)
    readout = slider.locator(".widget-readout")
    before_value, before_text = readout.inner_text().strip(), report.inner_text()
    assert "recurrent layers" in before_text, before_text
    handle = slider.locator(".noUi-handle, .ui-slider-handle").first
    handle.focus()
    for _ in range(4):
        page.keyboard.press("ArrowRight")
    n_rec = lambda t: int(re.search(r"recurrent layers: (\d+)", t).group(1))  # noqa: E731
    want = f"recurrent layers: {n_rec(before_text) + 4}"   # 4 more layers, all recurrent at period 8
    page.wait_for_function("([el, want]) => el.innerText.includes(want)",
                           arg=[report.element_handle(), want], timeout=30_000)
    assert int(readout.inner_text().strip()) == int(before_value) + 4
    page.wait_for_function(IDLE_JS, timeout=60_000)   # the redrawn figure is in place for the screenshot
    report.scroll_into_view_if_needed()


@pytest.mark.parametrize("lesson_id", list(_all_correct_notebooks()) if (REPO / "autograder").is_dir() else [])
def test_lesson_runs_in_jupyterlab(lab, browser_page, lesson_id):
    page, nb_name = browser_page, _all_correct_notebooks()[lesson_id].name
    rel = f"{lesson_id}/{nb_name}"
    shot = SCREENSHOTS / f"{lesson_id}.png"
    shot.unlink(missing_ok=True)
    _open_notebook(page, lab, rel)
    _nbgrader_tools_in_page(page)
    try:
        state = _run_all(page, LESSON_TIMEOUT_S)
        if lesson_id.startswith("04"):
            _slide_and_see_the_report_change(page, lesson_id)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))
        _check_ran_without_errors(lesson_id, state, _save_and_read(page, lab, rel))
    finally:
        if not shot.exists():   # a failure: keep what the page showed
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot))
        lab.shut_down_kernels()
