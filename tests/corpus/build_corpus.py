"""The adversarial corpus: a class of submissions that break, bend or attack the grader.

Each kind is one student, written from the released toy lesson (tests/toy_course.py), from
lesson 01 or from lesson 00, with the status and score the grader must give it (CASES,
L01_CASES, L00_CASES). The attacks of the grader's trust boundary (issue 11) try to forge a
grade, read hidden tests or secrets, change files outside their scratch folder, reach the
network or a socket, or outlive their job; an honest student is graded beside them. Build a class
with ``python tests/corpus/build_corpus.py DEST --course COURSE [--lesson01 REPO]`` and grade it
in one command: ``python -m autograder --course COURSE grade DEST --out OUT``. The toy course
must be built first (tests/test_grader_corpus.py does all of this).
"""
import copy
import json
import os
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

from autograder.cells import grade_id_of, is_graded, is_solution

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from toy_course import (ADD_SOLUTION, ASSIGNMENT, MEAN_SOLUTION, MUL_SOLUTION,  # noqa: E402
                        NOTEBOOK)

L01 = "01_running_sum"
L00 = "00_token_mixing"
MARKER = "corpus-marker"          # every file or process an attack leaves carries this in its name
# Where the network and socket attacks knock (the test listens there and counts connections).
PROBE = {"port": 47_811, "socket": "/tmp/corpus-listener.sock", "marker": MARKER}
WRONG_ADD = "def add(a, b):\n    return a - b"
WRONG_MUL = "def mul(a, b):\n    return a + b"
MAX_BYTES = 256 * 1024        # the corpus is graded with --max-size 0.25 (MiB)

# student -> (status prefix, score, a substring of the notes or status, or "")
CASES = {
    "ok_correct": ("graded", 6, ""),
    "ok_blank": ("graded", 0, ""),
    "renamed_copy_of": ("graded", 6, "renamed 'Copy of toy (1).ipynb'"),
    "two_submissions_latest_wins": ("graded", 6, "2 submissions: graded the latest"),
    "nested_attempt_folder": ("graded", 6, ""),
    "wrapper_folder": ("graded", 6, "found inside 'submission/'"),
    "loose_notebook": ("graded", 6, "not in an <assignment>/ folder"),
    "duplicated_solution_cell": ("graded", 6, "appeared 2 times"),
    "deleted_test_cell": ("graded", 3, "'test_mul' was deleted: restored"),
    "deleted_solution_cell": ("graded", 3, "'mul' was deleted: put back blank"),
    "metadata_lost_new_ids": ("graded", 4, "lost on 6 cell(s): re-attached by source similarity"),
    "metadata_lost_same_ids": ("graded", 6, "lost on 6 cell(s): re-attached by cell id"),
    "test_cell_made_markdown": ("graded", 3, "changed back to code"),
    "foreign_kernelspec": ("graded", 6, "kernel 'ir' replaced by 'python3'"),
    "nbformat_4_0_no_ids": ("graded", 6, "without cell ids"),
    "nbformat_3": ("graded", 6, "converted from nbformat 3"),
    "edited_test_cell": ("graded", 4, "'test_add' had been edited: restored"),
    "edited_test_and_metadata_lost": ("graded", 4, "'test_add' had been edited: restored"),
    "swallows_assertions": ("needs manual review", 0, "IPython custom exception handler"),
    # issue 51: a function of the standard library or torch replaced in the student's own kernel is
    # said in the notes, never held (the tests run outside the kernel); the grader's machinery is held
    "patches_math_isclose": ("graded", 5, "math.isclose"),
    "shadows_builtin_abs": ("graded", 5, ""),      # tests use the real abs; a student's own is harmless
    "changes_points": ("needs manual review", 6, "grader settings of test cell 'test_add'"),
    "warning_on_stderr": ("graded", 6, ""),
    "endless_loop": ("timed out", 3, "test_mul"),
    "kernel_killed": ("needs manual review", 0, "the kernel died"),
    "network_probe": ("graded", 6, ""),
    "looks_for_grades": ("graded", 6, ""),
    "feels_its_limits": ("graded", 6, ""),          # memory and CPU-time limits are in force
    # The trust boundary (issue 11): each attack scores what a blank notebook scores, or keeps
    # exactly what it answered honestly, and is flagged where it tampered with the kernel.
    "rewrites_cells": ("needs manual review", 0, "blocked or rewritten"),
    "rewrites_asserts": ("needs manual review", 0, "IPython AST transformers"),
    "patches_checks": ("graded", 0, "math.isclose"),
    "equal_to_everything": ("graded", 0, ""),
    "exits_when_tested": ("needs manual review", 0, "the kernel died"),
    "reads_tests": ("graded", 6, ""),
    "reads_secrets": ("graded", 6, ""),
    "writes_elsewhere": ("graded", 6, ""),
    "knocks_on_sockets": ("graded", 6, ""),
    "forks_many": ("graded", 6, ""),
    "floods_output": ("graded", 6, "output capped"),
    "broken_json": ("rejected", 0, "not valid notebook JSON"),
    "empty_file": ("rejected", 0, "the file is empty"),
    "huge_file": ("rejected", 0, "MiB limit"),
    "json_not_notebook": ("rejected", 0, "not a Jupyter notebook"),
    "json_list": ("rejected", 0, "not a Jupyter notebook: the file holds a list"),
    # ids nbgrader would read as globs (issue 12): graded under a safe internal id
    "li[1]": ("graded", 6, ""),
    "Smith, J [12345]": ("graded", 4, ""),
    "pdf_instead": ("rejected", 0, "no .ipynb file"),
    # Issue 25: honest oddities grade as graded with their honest score (HONEST_ODDITIES: never
    # a note of an edit, never a failed feedback page); the attacks score what a blank does.
    "crlf_line_endings": ("graded", 6, ""),
    "crlf_file": ("graded", 6, ""),
    "stripped_with_filler": ("graded", 6, "re-attached by source similarity"),
    "prints_lone_surrogate": ("graded", 6, ""),
    "lone_surrogate_name": ("graded", 6, ""),
    "returns_lone_surrogate": ("graded", 3, ""),
    "returns_huge_int": ("graded", 3, ""),
    "raises_lone_surrogate": ("graded", 3, ""),
    "hidden_words_in_comment": ("graded", 6, ""),
    "hidden_words_in_markdown": ("graded", 6, ""),
    "hidden_markers_on_blank": ("graded", 0, ""),
    "fake_pass_in_message": ("graded", 0, ""),
    "imitates_feedback": ("graded", 0, ""),
    # Issue 25, item 3: fills every place it may write (working folder, /tmp, /dev/shm, the
    # kernel's connection folder) to its cap; graded beside the others at -j 2, it keeps its
    # honest answers and breaks no neighbour.
    "fills_its_space": ("graded", 6, ""),
    # Item 8: nested user namespaces, io_uring, keyrings, bpf, ptrace, mounts through ctypes and
    # through util-linux's unshare; each is refused, and the honest answers keep their points.
    "calls_the_kernel_surface": ("graded", 6, ""),
}
HONEST_ODDITIES = ("crlf_line_endings", "crlf_file", "stripped_with_filler", "prints_lone_surrogate",
                   "lone_surrogate_name", "returns_lone_surrogate", "returns_huge_int",
                   "raises_lone_surrogate", "hidden_words_in_comment", "hidden_words_in_markdown",
                   "l01_colab_stripped_filler", "l01_crlf")
L01_CASES = {
    "l01_patches_mlexp_ops": ("needs manual review", 7, "mlexp.ops.linear_attention"),
    "l01_swallows_on_blank": ("needs manual review", 0, "IPython custom exception handler"),
    "l01_colab_stripped": ("graded", 10, "re-attached by source similarity"),
    "l01_test_to_print": ("needs manual review", 0, "IPython input transformers"),
    "l01_patches_checks": ("graded", 0, "torch.allclose"),
    "l01_equal_objects": ("graded", 0, ""),
    "l01_exits_when_tested": ("needs manual review", 0, "the kernel died"),
    # inspect.stack() and sys._getframe in an answer of a lesson with rules: the tests run outside
    # the kernel, so there is nothing to read there; graded (issue 51: the standard library holds nothing)
    "l01_prints_history": ("graded", 10, ""),
    "l01_colab_stripped_filler": ("graded", 10, "re-attached by source similarity"),
    "l01_crlf": ("graded", 10, ""),
    "l01_fills_its_space": ("needs manual review", 10, "imports ipykernel.connect, the kernel's own messaging"),
    # Issue 39: the rules' watcher swapped (the call is read in the source: that test fails),
    # the library's source exec'd, the library's function pasted and renamed (held for review, the
    # reason naming the library's function).
    "l01_swaps_trace": ("needs manual review", 7, "replaces mlexp.rules.Trace"),
    # the room (no mlexp.ops there) fails the recurrent form; the reading holds it with the true reason
    "l01_execs_library_source": ("needs manual review", 7, "mlexp.ops.linear._recurrent, read with inspect.getsource"),
    # held naming the paste, and the recurrent form's 3 points lost: the room's guard refuses its code
    "l01_pastes_library": ("needs manual review", 7, "_scan is the code of mlexp.ops.linear._recurrent"),
    "l01_rewrites_the_report": ("needs manual review", 7, "IPython's shell"),
}
L00_CASES = {
    "l00_equal_objects": ("graded", 0, ""),
}

# Attack code, as a student would paste it into an answer cell. FIND walks the file system the
# kernel can see (skipping the large package folders) for files of the grader and of the class.
FIND = """
import os
def find(*names):
    hits, seen = [], 0
    for root in ('/', '..', '../..'):
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in ('site-packages', 'proc', 'sys', 'usr', 'dev')]
            seen += 1
            if seen > 20000:
                return hits
            hits += [os.path.join(folder, n) for n in dirs + files if n in names]
    return hits
"""
ALWAYS_EQUAL = """
class AlwaysEqual(float):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __lt__(self, other):
        return True
    __le__ = __gt__ = __ge__ = __lt__
    __hash__ = float.__hash__
"""
REWRITE_CELLS = """
ip = get_ipython()
ip.input_transformers_post.append(lambda lines: ['print("ok")\\n'] if lines and lines[0].startswith('# Test') else lines)
ip.input_transformers_cleanup.append(lambda lines: ['pass\\n'] if any('kernel_request' in l or 'assert' in l for l in lines) else lines)
"""
REWRITE_ASSERTS = """
import ast
class NoAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):
        return ast.Pass()
get_ipython().ast_transformers.append(NoAsserts())
"""
PATCH_CHECKS = """
import builtins, math, operator
for name in [n for n in vars(builtins) if n.startswith('_grader')]:
    delattr(builtins, name)
math.isclose = lambda *args, **kwargs: True
operator.eq = lambda a, b: True
"""
EXIT_WHEN_TESTED = """
import os
def _stop(*args, **kwargs):
    os._exit(0)
get_ipython().events.register('pre_run_cell', _stop)
"""
READ_TESTS = """
import inspect, linecache, sys
print(In)
print(sorted(linecache.cache))
def add(a, b):
    for frame in inspect.stack():
        print(frame.filename, frame.code_context)
    caller = sys._getframe(1)
    print(linecache.getlines(caller.f_code.co_filename))
    return a + b
"""
READ_SECRETS = FIND + """
import glob, os
FOUND = []
for var, value in os.environ.items():
    if any(word in value for word in ('solutions', '--db', 'postgresql', 'grades', 'autograded')):
        FOUND.append(var)
for path in os.environ.get('PYTHONPATH', '').split(os.pathsep):
    if path and os.path.isdir(os.path.join(path, 'solutions')):
        FOUND.append('solutions via PYTHONPATH')
for cmdline in glob.glob('/proc/*/cmdline'):
    try:
        text = open(cmdline, 'rb').read()
    except OSError:
        continue
    if b'--db' in text or b'postgresql' in text or b'solutions' in text or b'grade ' in text:
        FOUND.append(cmdline)
FOUND += find('gradebook.db', 'grades.csv', 'solutions', 'results', 'submitted', 'autograded',
              'ok_correct', 'ok_blank', 'reads_tests')
print('found:', FOUND)
def mul(a, b):
    return a * b if not FOUND else None
"""
WRITE_ELSEWHERE = FIND + """
import glob, os, subprocess, sys
MARK = '{marker}'
WROTE = []
for folder in ['.', '..', '../..', '/tmp', '/dev/shm', os.path.expanduser('~'), '/var/tmp', '/home',
               *glob.glob('/tmp/*'), *find('results', 'feedback', 'work')]:
    try:
        with open(os.path.join(folder, MARK + '-file'), 'w') as f:
            f.write('x')
        WROTE.append(folder)
    except OSError:
        pass
for target in find('grades.csv', 'ok_correct.json', 'job.json', 'in.ipynb'):
    try:
        open(target, 'w').write('forged')
    except OSError:
        pass
DAEMON = (
    "import os, time\\n"
    "for _ in range(300):\\n"
    "    for d in ('/tmp', '/dev/shm', '..'):\\n"
    "        try: open(os.path.join(d, '{marker}-daemon'), 'w').write('x')\\n"
    "        except OSError: pass\\n"
    "    time.sleep(0.2)\\n")
subprocess.Popen([sys.executable, '-c', DAEMON, '{marker}'], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print('wrote into', WROTE)
"""
KNOCK = """
import ctypes, glob, os, socket
from ipykernel.connect import get_connection_file
OWN = os.path.dirname(get_connection_file())    # the kernel's own sockets: talking to itself
REACHED = []
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()
    REACHED.append('tcp loopback')
except OSError:
    pass
try:
    socket.create_connection(('1.1.1.1', 53), timeout=2).close()
    REACHED.append('internet')
except OSError:
    pass
for path in ['{socket}'] + glob.glob('/tmp/**/*', recursive=True) + glob.glob('/run/**/*', recursive=True):
    if os.path.dirname(path) == OWN:
        continue
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(1)
        s.connect(path)
        REACHED.append(path)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
for ns in glob.glob('/proc/*/ns/net'):
    try:
        fd = os.open(ns, os.O_RDONLY)
        if libc.setns(fd, 0) == 0:
            REACHED.append('setns ' + ns)
    except OSError:
        pass
print('reached:', REACHED)
def mul(a, b):
    return a * b if not REACHED else None
"""
FORKS = """
import subprocess
STARTED = []
try:
    for _ in range(200):
        STARTED.append(subprocess.Popen(['sh', '-c', 'sleep 600; :', '{marker}']))
except OSError:
    pass
print('started', len(STARTED), 'processes')
def mul(a, b):
    return a * b if len(STARTED) < 200 else None
"""
FLOOD = """
print('x' * 10**8)
def mul(a, b):
    return a * b
"""

# Writes 1 MiB at a time into each writable place until the file system refuses (ENOSPC, or
# EFBIG at the file-size limit); FILLED: place -> (bytes written, errno, file system's size).
FILL_SPACE = """
import os
from ipykernel.connect import get_connection_file
def _fill(folder, chunk=b'x' * 2**20):
    total = 0
    for i in range(4096):
        try:
            fd = os.open(os.path.join(folder, f'corpus-marker-fill-{i}'), os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError as exc:
            return total, exc.errno
        try:
            for _ in range(16):
                total += os.write(fd, chunk)
        except OSError as exc:
            return total, exc.errno
        finally:
            os.close(fd)
    return total, 0
FILLED = {}
for place in ('/home/student', '/tmp', '/dev/shm', 'ipc'):
    folder = os.path.dirname(get_connection_file()) if place == 'ipc' else place
    written, err = _fill(folder)
    st = os.statvfs(folder)
    FILLED[place] = (written, err, st.f_blocks * st.f_frsize)
"""
# Each call through ctypes and the unshare command; REFUSED holds what failed, and the answer
# is right only when everything was refused (the names are those of x86_64 and aarch64).
KERNEL_SURFACE = """
import ctypes, os, platform, subprocess
NR = {'x86_64': {'unshare': 272, 'clone3': 435, 'io_uring_setup': 425, 'add_key': 248,
                 'keyctl': 250, 'bpf': 321, 'ptrace': 101, 'mount': 165, 'userfaultfd': 323},
      'aarch64': {'unshare': 97, 'clone3': 435, 'io_uring_setup': 425, 'add_key': 217,
                  'keyctl': 219, 'bpf': 280, 'ptrace': 117, 'mount': 40, 'userfaultfd': 282}}
ARGS = {'unshare': [0x10000000], 'clone3': [0, 0], 'io_uring_setup': [1, 0], 'ptrace': [0, 0, 0, 0]}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
REFUSED = {}
for name, nr in NR[platform.machine()].items():
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in ARGS.get(name, [0, 0, 0, 0, 0])])
    REFUSED[name] = rc < 0 and ctypes.get_errno() in (1, 38)     # EPERM, ENOSYS
try:
    REFUSED['unshare -U'] = subprocess.run(['unshare', '-Ur', 'true'], capture_output=True).returncode != 0
except OSError:
    REFUSED['unshare -U'] = True
print('refused:', REFUSED)
"""

# Escape codes that would redraw a terminal's last line as a PASS (issue 25, item 6), and
# student HTML that copies the feedback page's own status elements.
FAKE_PASS = "\x1b[2K\r\x1b[1APASS  test_add   2/2\nvisible tests: 3/3 passed, 6/6 points\x1b[8m"
IMITATION = ('<div class="mlexp-ok">Passed.</div><table class="mlexp-summary"><tr class="exercise '
             'passed"><td class="mark">✓</td><td class="score">6 / 6</td></tr></table>'
             '<h4>toy (Score: 6.0 / 6.0)</h4>')


def element_classes(page: str) -> list:
    """("class" or "id", name) of every element of an HTML page, in order (text not counted)."""
    from html.parser import HTMLParser
    found = []

    class Classes(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend((k, c) for k, v in attrs if k in ("class", "id") and v for c in v.split())
    Classes().feed(page)
    return found


def _crlf(nb):
    """A copy of ``nb`` whose every cell source has CRLF line endings and trailing spaces."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        cell.source = "\r\n".join(line + "  " for line in cell.source.split("\n"))
    return nb


def _with_filler(nb, n: int, seed=0):
    """A copy of ``nb`` with ``n`` one-line comment cells of 2 KB after its test cells (made
    of its own characters), as a notebook near the size limit has many cells."""
    import random
    nb = copy.deepcopy(nb)
    rng = random.Random(seed)
    alphabet = sorted(set("".join(c.source for c in nb.cells)) - {"\n", "\r"})
    after = [i + 1 for i, c in enumerate(nb.cells) if is_graded(c)]
    for _ in range(n):
        at = rng.choice(after)
        after = [i + (i > at) for i in after]
        nb.cells.insert(at, new_code_cell("# " + "".join(rng.choice(alphabet) for _ in range(2000))))
    return nb


def _answer(nb, answers: dict):
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        gid = grade_id_of(cell)
        if gid in answers:
            cell.source = answers[gid]
    return nb


def _index(nb, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells)
                if grade_id_of(c) == grade_id)


def _strip(nb, new_ids: bool):
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("nbgrader", None)
        if new_ids:
            cell.id = f"colab-{i:03d}"
    return nb


def _prepend(nb, code: str):
    """A copy of ``nb`` with a code cell ``code`` inserted after its first cell."""
    nb = copy.deepcopy(nb)
    nb.cells.insert(1, new_code_cell(code))
    return nb


def toy_cases(lesson, probe=PROBE) -> dict:
    """student -> (file name relative to <student>/, bytes or notebook) for the toy lesson.

    ``probe`` names the TCP port, the Unix socket and the file marker of the attacks that knock
    or write outside their sandbox (the test listens and looks there)."""
    good = _answer(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION})
    right = {"add": ADD_SOLUTION, "mean": MEAN_SOLUTION}
    files = {"ok_correct": {f"{ASSIGNMENT}/{NOTEBOOK}": good},
             "ok_blank": {f"{ASSIGNMENT}/{NOTEBOOK}": lesson},
             "renamed_copy_of": {f"{ASSIGNMENT}/Copy of toy (1).ipynb": good},
             "two_submissions_latest_wins": {f"{ASSIGNMENT}/toy.ipynb": _answer(
                 lesson, {"add": WRONG_ADD, "mul": WRONG_MUL}), f"{ASSIGNMENT}/toy (1).ipynb": good},
             "nested_attempt_folder": {f"{ASSIGNMENT}/attempt_2/{NOTEBOOK}": good},
             "wrapper_folder": {f"submission/{ASSIGNMENT}/{NOTEBOOK}": good},
             "loose_notebook": {NOTEBOOK: good}}
    dup = copy.deepcopy(good)
    first = copy.deepcopy(dup.cells[_index(dup, "add")])
    first.source, first.id = WRONG_ADD, "an-older-copy"
    dup.cells.insert(_index(dup, "add"), first)
    files["duplicated_solution_cell"] = {f"{ASSIGNMENT}/{NOTEBOOK}": dup}
    nb = _answer(lesson, {**right, "mul": WRONG_MUL})
    del nb.cells[_index(nb, "test_mul")]
    files["deleted_test_cell"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = copy.deepcopy(good)
    del nb.cells[_index(nb, "mul")]
    files["deleted_solution_cell"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = _strip(_answer(lesson, {"add": WRONG_ADD, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}), new_ids=True)
    files["metadata_lost_new_ids"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    files["metadata_lost_same_ids"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _strip(copy.deepcopy(good), False)}
    nb = _answer(lesson, {**right, "mul": WRONG_MUL})
    cell = nb.cells[_index(nb, "test_mul")]
    cell.cell_type = "markdown"
    cell.pop("outputs", None)
    cell.pop("execution_count", None)
    files["test_cell_made_markdown"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = copy.deepcopy(good)
    nb.metadata["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    files["foreign_kernelspec"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    raw = json.loads(nbformat.writes(good))
    raw["nbformat_minor"] = 0
    for c in raw["cells"]:
        c.pop("id", None)
    files["nbformat_4_0_no_ids"] = {f"{ASSIGNMENT}/{NOTEBOOK}": json.dumps(raw).encode()}
    files["nbformat_3"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nbformat.writes(
        nbformat.convert(copy.deepcopy(good), 3), version=3).encode()}
    nb = _answer(lesson, {"add": WRONG_ADD, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION})
    nb.cells[_index(nb, "test_add")].source = "assert True  # nothing to see here"
    files["edited_test_cell"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = _answer(lesson, {"add": WRONG_ADD, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION})
    nb.cells[_index(nb, "test_add")].source = "pass"
    nb.cells[_index(nb, "test_add")].metadata.pop("nbgrader")
    files["edited_test_and_metadata_lost"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = copy.deepcopy(lesson)
    nb.cells.insert(1, new_code_cell("get_ipython().set_custom_exc((Exception,), "
                                     "lambda *args, **kwargs: None)"))
    files["swallows_assertions"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = _answer(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION,
                          "mean": "import math\nmath.isclose = lambda *args, **kwargs: True\n"
                                  "def mean(xs):\n    return 0.0"})
    files["patches_math_isclose"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = _answer(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION,
                          "mean": "def abs(x):\n    return 0.0\ndef mean(xs):\n    return 2.5"})
    files["shadows_builtin_abs"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    files["warning_on_stderr"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right,
        "mul": "import warnings\ndef mul(a, b):\n    warnings.warn('mul is slow', RuntimeWarning)\n"
               "    return a * b"})}
    files["endless_loop"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right, "mul": "def mul(a, b):\n    while True:\n        pass"})}
    nb = copy.deepcopy(good)
    nb.cells.insert(_index(nb, "add"), new_code_cell("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"))
    files["kernel_killed"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    files["network_probe"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right,
        "mul": "import socket\nONLY_LOOPBACK = [n for _, n in socket.if_nameindex()] == ['lo']\n"
               "def mul(a, b):\n    return a * b if ONLY_LOOPBACK else None"})}
    files["looks_for_grades"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right,
        "mul": "import os\nSEEN = [p for d in ('.', '..', '../..') for p in os.listdir(d)\n"
               "        if p in ('gradebook.db', 'solutions', 'source', 'autograded')]\n"
               "def mul(a, b):\n    return a * b if not SEEN else SEEN"})}
    files["feels_its_limits"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right,
        "mul": "import mmap, resource\n"
               "LIMITED = resource.getrlimit(resource.RLIMIT_CPU)[0] != resource.RLIM_INFINITY\n"
               "try:\n    mmap.mmap(-1, 6 * 2**30)   # address space only, no memory touched\n"
               "except OSError:\n    pass\nelse:\n    LIMITED = False\n"
               "def mul(a, b):\n    return a * b if LIMITED else None"})}
    blank_with = lambda code: _prepend(lesson, code)   # noqa: E731  (a blank notebook + an attack)
    files["rewrites_cells"] = {f"{ASSIGNMENT}/{NOTEBOOK}": blank_with(REWRITE_CELLS)}
    files["rewrites_asserts"] = {f"{ASSIGNMENT}/{NOTEBOOK}": blank_with(REWRITE_ASSERTS)}
    files["patches_checks"] = {f"{ASSIGNMENT}/{NOTEBOOK}": blank_with(PATCH_CHECKS)}
    files["equal_to_everything"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        "add": ALWAYS_EQUAL + "def add(a, b):\n    return AlwaysEqual(0)",
        "mul": "class Same(tuple):\n    def __eq__(self, other):\n        return True\n"
               "def mul(a, b):\n    return Same()",
        "mean": ALWAYS_EQUAL + "def mean(xs):\n    return AlwaysEqual('nan')"})}
    files["exits_when_tested"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        "add": EXIT_WHEN_TESTED + ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION})}
    files["reads_tests"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        "add": READ_TESTS, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION + "\nprint(In)"})}
    files["reads_secrets"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right, "mul": READ_SECRETS})}
    files["writes_elsewhere"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right, "mul": WRITE_ELSEWHERE.format(**probe) + MUL_SOLUTION})}
    files["knocks_on_sockets"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right, "mul": KNOCK.format(**probe)})}
    files["forks_many"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {**right, "mul": FORKS.format(**probe)})}
    files["floods_output"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {**right, "mul": FLOOD})}
    nb = copy.deepcopy(good)
    nb.cells[_index(nb, "test_add")].metadata["nbgrader"]["points"] = 100
    files["changes_points"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    files["broken_json"] = {f"{ASSIGNMENT}/{NOTEBOOK}": b'{"cells": [ broken'}
    files["empty_file"] = {f"{ASSIGNMENT}/{NOTEBOOK}": b""}
    big = copy.deepcopy(good)
    big.cells.append(nbformat.v4.new_markdown_cell("x" * (MAX_BYTES + 1000)))
    files["huge_file"] = {f"{ASSIGNMENT}/{NOTEBOOK}": big}
    files["json_not_notebook"] = {f"{ASSIGNMENT}/{NOTEBOOK}": b'{"hello": "world"}'}
    files["json_list"] = {f"{ASSIGNMENT}/{NOTEBOOK}": b"[1, 2, 3]"}
    files["li[1]"] = {f"{ASSIGNMENT}/{NOTEBOOK}": good}
    files["Smith, J [12345]"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(
        lesson, {"add": WRONG_ADD, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION})}
    files["pdf_instead"] = {f"{ASSIGNMENT}/toy.pdf": b"%PDF-1.4 not a notebook"}
    files.update(_issue25_toy_cases(lesson, good, right))
    return files


def _issue25_toy_cases(lesson, good, right) -> dict:
    """Issue 25's toy kinds: line endings, a stripped notebook of many cells, lone surrogates
    and long ints on the wire, the hidden-test marker words, escape codes and feedback HTML."""
    one = lambda nb: {f"{ASSIGNMENT}/{NOTEBOOK}": nb}   # noqa: E731
    files = {"crlf_line_endings": one(_crlf(good)),
             "crlf_file": one(nbformat.writes(good).replace("\n", "\r\n").encode()),
             "stripped_with_filler": one(_strip(_with_filler(good, 90), True))}
    files["prints_lone_surrogate"] = one(_answer(lesson, {
        **right, "mul": MUL_SOLUTION + "\nprint('mul is done \\ud800')"}))
    files["lone_surrogate_name"] = one(_answer(lesson, {
        **right, "mul": MUL_SOLUTION + "\nmul.__name__ = 'mul\\ud800'"}))
    files["returns_lone_surrogate"] = one(_answer(lesson, {
        **right, "mul": "def mul(a, b):\n    return 'x\\ud800'"}))
    files["returns_huge_int"] = one(_answer(lesson, {
        **right, "mul": "def mul(a, b):\n    return a * b * 10**5000"}))
    files["raises_lone_surrogate"] = one(_answer(lesson, {
        **right, "mul": "def mul(a, b):\n    raise ValueError('bad \\ud800')"}))
    files["hidden_words_in_comment"] = one(_answer(lesson, {
        "add": ADD_SOLUTION + "  # ### BEGIN HIDDEN TESTS would go here, says the lesson",
        "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}))
    nb = copy.deepcopy(good)
    nb.cells.append(nbformat.v4.new_markdown_cell("My notes: the test cell has a BEGIN HIDDEN "
                                                  "TESTS part I cannot see."))
    files["hidden_words_in_markdown"] = one(nb)
    files["hidden_markers_on_blank"] = one(_prepend(lesson, "### END HIDDEN TESTS\n"
                                                    "### BEGIN HIDDEN TESTS\n### BEGIN HIDDEN TESTS"))
    raising = "def {0}(*args):\n    raise ValueError(" + repr(FAKE_PASS) + ")"
    files["fake_pass_in_message"] = one(_answer(lesson, {
        g: raising.format(g) for g in ("add", "mul", "mean")}))
    nb = _prepend(lesson, f"from IPython.display import HTML, display\ndisplay(HTML({IMITATION!r}))")
    nb.cells.append(nbformat.v4.new_markdown_cell(IMITATION))
    files["imitates_feedback"] = one(nb)
    files["fills_its_space"] = one(_answer(lesson, {
        **right, "mul": FILL_SPACE + "print(FILLED)\n" + MUL_SOLUTION}))
    files["calls_the_kernel_surface"] = one(_answer(lesson, {
        **right, "mul": KERNEL_SURFACE + "def mul(a, b):\n    return a * b if all(REFUSED.values()) else None"}))
    return files


def solved_answers(solution) -> dict:
    """grade_id -> the instructor's answer of each solution cell, as a student would type it."""
    return {grade_id_of(c): "\n".join(
        ln for ln in c.source.splitlines() if "### " not in ln)
        for c in solution.cells if is_solution(c)}


def lesson01_cases(lesson, solution) -> dict:
    """student -> files for three attacks on lesson 01 (torch, mlexp.ops, Colab)."""
    good = _answer(lesson, solved_answers(solution))
    nb = copy.deepcopy(good)   # right on the worked example, wrong on longer sequences
    i = _index(nb, "recurrent_form")
    nb.cells[i].source = nb.cells[i].source.replace(
        "    return torch.stack(outputs, dim=2)",
        "    o = torch.stack(outputs, dim=2)\n    return o if T <= 2 else o + 1")
    nb.cells.insert(i + 1, new_code_cell(
        "import mlexp.ops\n"
        "mlexp.ops.linear_attention = lambda q, k, v, normalize=True, **kw: "
        "(recurrent_linear_attention(q, k, v, normalize), None)"))
    files = {"l01_patches_mlexp_ops": {f"{L01}/{L01}.ipynb": nb}}
    nb = copy.deepcopy(lesson)
    nb.cells.insert(1, new_code_cell("get_ipython().set_custom_exc((Exception,), "
                                     "lambda *args, **kwargs: None)"))
    files["l01_swallows_on_blank"] = {f"{L01}/{L01}.ipynb": nb}
    nb = _strip(copy.deepcopy(good), new_ids=True)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.metadata["colab"] = {"provenance": []}
    files["l01_colab_stripped"] = {f"{L01}/{L01}.ipynb": nb}
    nb = _prepend(lesson, "ip = get_ipython()\nip.input_transformers_post.append(lambda lines: "
                          "['print(\"passed\")\\n'] if lines and lines[0].startswith('# Test:') else lines)")
    files["l01_test_to_print"] = {f"{L01}/{L01}.ipynb": nb}
    nb = _prepend(lesson, PATCH_CHECKS + "import torch\ntorch.allclose = lambda *a, **k: True\n"
                          "torch.equal = lambda *a, **k: True")
    files["l01_patches_checks"] = {f"{L01}/{L01}.ipynb": nb}
    files["l01_equal_objects"] = {f"{L01}/{L01}.ipynb": _answer(lesson, {
        "your_turn_answer": ALWAYS_EQUAL + "answer = (AlwaysEqual(0), AlwaysEqual(0))",
        "cost_per_token": ALWAYS_EQUAL + "def attention_ops_per_token(t, d):\n    return AlwaysEqual(0)\n"
                          "def state_ops_per_token(d):\n    return AlwaysEqual(0)"})}
    nb = _prepend(lesson, EXIT_WHEN_TESTED)
    files["l01_exits_when_tested"] = {f"{L01}/{L01}.ipynb": nb}
    nb = copy.deepcopy(good)
    nb.cells.append(new_code_cell(READ_TESTS.replace("def add(a, b):", "def _unused(a, b):")))
    i = _index(nb, "cost_per_token")
    nb.cells[i].source += ("\nimport inspect, sys, linecache\n_real = attention_ops_per_token\n"
                           "def attention_ops_per_token(t, d):\n"
                           "    print(linecache.getlines(sys._getframe(1).f_code.co_filename))\n"
                           "    print([f.code_context for f in inspect.stack()])\n"
                           "    return _real(t, d)")
    files["l01_prints_history"] = {f"{L01}/{L01}.ipynb": nb}
    nb = _strip(_with_filler(good, 70), new_ids=True)
    nb.metadata["colab"] = {"provenance": []}
    files["l01_colab_stripped_filler"] = {f"{L01}/{L01}.ipynb": nb}
    files["l01_crlf"] = {f"{L01}/{L01}.ipynb": _crlf(good)}
    files["l01_fills_its_space"] = {f"{L01}/{L01}.ipynb": _prepend(good, FILL_SPACE + "print(FILLED)")}
    return files


# Issue 39, items 1 and 2: the exercise rules' watcher runs in the student's kernel, so these
# answers try to get past it; autograder.engine.audit reads the source where they cannot reach.
SWAPS_TRACE = """
import mlexp.ops
import mlexp.rules


class _Quiet(mlexp.rules.Trace):      # a watcher whose report hides every library call
    def to_dict(self):
        data = super().to_dict()
        data["used"] = []
        return data


mlexp.rules.Trace = _Quiet


def recurrent_linear_attention(q, k, v, normalize=True):
    return mlexp.ops.linear_attention(q, k, v, normalize=normalize)[0]
"""
EXECS_LIBRARY_SOURCE = """
import inspect
import mlexp.ops.linear as _lin

exec(compile(inspect.getsource(_lin._recurrent), "<my own>", "exec"))


def recurrent_linear_attention(q, k, v, normalize=True):
    B, H, T, D_k = q.shape
    S = q.new_zeros(B, H, D_k, v.shape[-1])
    z = q.new_zeros(B, H, D_k) if normalize else None
    return _recurrent(q, k, v, S, z, 1e-6)[0]
"""


# The report rewritten on its way out (IPython's display publisher), the watcher swapped only
# while the tests run, both put back in the notebook's last cell.
REWRITES_THE_REPORT = SWAPS_TRACE + """
_Real = _Quiet.__bases__[0]
ip = get_ipython()
_publish = ip.display_pub.publish


def _scrubbed(data, *args, **kwargs):
    data = {key: value.replace("mlexp.rules.Trace", "") if isinstance(value, str) else value
            for key, value in data.items()}
    return _publish(data, *args, **kwargs)


ip.display_pub.publish = _scrubbed
"""
PUTS_IT_BACK = "ip.display_pub.publish = _publish\nmlexp.rules.Trace = _Real\n"


def pasted_library_function(path, name, new_name) -> str:
    """The library function ``name`` of the file ``path`` as a student would paste it: renamed,
    every argument and local name changed, docstring and comments gone."""
    import ast
    fn = next(n for n in ast.parse(Path(path).read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.name, fn.body = new_name, fn.body[1:] if isinstance(fn.body[0], ast.Expr) else fn.body
    local = {a.arg for a in fn.args.args} | {n.id for n in ast.walk(fn)
                                              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(fn):
        if isinstance(node, ast.arg):
            node.arg = f"my_{node.arg}"
        elif isinstance(node, ast.Name) and node.id in local:
            node.id = f"my_{node.id}"
    return ast.unparse(fn)


def pastes_library(repo) -> str:
    """An answer that runs lesson 01's library reference, pasted and renamed."""
    paste = pasted_library_function(Path(repo) / "mlexp" / "ops" / "linear.py", "_recurrent", "_scan")
    return "import torch\n\n\n" + paste + EXECS_LIBRARY_SOURCE.split("def recurrent", 1)[1].join(
        ["\n\n\ndef recurrent", ""]).replace("_recurrent(", "_scan(")


def lesson01_rule_cases(lesson, solution, repo) -> dict:
    """student -> files for the attacks on lesson 01's rule (the recurrent form, write it yourself)."""
    good = _answer(lesson, solved_answers(solution))
    cases = {}
    for student, source in (("l01_swaps_trace", SWAPS_TRACE), ("l01_execs_library_source", EXECS_LIBRARY_SOURCE),
                            ("l01_pastes_library", pastes_library(repo))):
        nb = copy.deepcopy(good)
        i = _index(nb, "recurrent_form")
        nb.cells[i].source += "\n\n" + source
        cases[student] = {f"{L01}/{L01}.ipynb": nb}
    nb = copy.deepcopy(good)
    i = _index(nb, "recurrent_form")
    nb.cells[i].source += "\n\n" + REWRITES_THE_REPORT
    nb.cells.append(new_code_cell(PUTS_IT_BACK))
    cases["l01_rewrites_the_report"] = {f"{L01}/{L01}.ipynb": nb}
    return cases


def lesson00_cases(lesson) -> dict:
    """student -> files for lesson 00: the always-equal object on the receptive-field exercise."""
    return {"l00_equal_objects": {f"{L00}/{L00}.ipynb": _answer(lesson, {
        "reach": ALWAYS_EQUAL + "def conv_reach(n_layers, kernel_size):\n    return AlwaysEqual(0)\n\n\n"
                 "print({L: conv_reach(L, 4) for L in (1, 2, 4, 8)})"})}}


def write_class(dest: Path, toy_lesson, l01=None, l00=None, probe=PROBE) -> Path:
    """Write every case under ``dest/<student>/...``; ``l01`` = (lesson, solution) or None,
    ``l00`` = lesson 00's released notebook or None."""
    cases = toy_cases(toy_lesson, probe)
    if l01 is not None:
        cases.update(lesson01_cases(*l01))
        cases.update(lesson01_rule_cases(*l01, HERE.parent.parent))
    if l00 is not None:
        cases.update(lesson00_cases(l00))
    for student, files in cases.items():
        for t, (rel, content) in enumerate(files.items()):   # listed oldest first
            path = Path(dest) / student / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            data = content if isinstance(content, bytes) else nbformat.writes(content).encode()
            path.write_bytes(data)
            os.utime(path, (1_700_000_000 + 60 * t, 1_700_000_000 + 60 * t))   # later name, later time
    return Path(dest)


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dest")
    p.add_argument("--course", required=True, help="toy course root with lessons/toy built")
    p.add_argument("--lesson01", metavar="REPO", help="also write the lesson 01 cases from REPO")
    a = p.parse_args()
    toy = nbformat.read(Path(a.course) / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    l01 = None
    if a.lesson01:
        l01 = tuple(nbformat.read(Path(a.lesson01) / d / L01 / f"{L01}.ipynb", as_version=4)
                    for d in ("lessons", "solutions"))
    write_class(Path(a.dest), toy, l01)
