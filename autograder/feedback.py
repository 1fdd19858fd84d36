"""Feedback pages without hidden tests or student scripts: preprocessors for generate_feedback."""
import re

import nh3
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor

from .mistakes import exercise_titles, hint_shown, is_test_cell

__all__ = ["HideHiddenTests", "ExerciseFeedback", "SanitizeFeedback", "clean_html"]

NOTE = "(traceback not shown: this test cell holds hidden tests)"


class HideHiddenTests(ClearHiddenTests):
    """Remove hidden test regions, and the tracebacks that would quote them, from feedback.

    ``nbgrader autograde`` restores every test cell from the gradebook, hidden tests included,
    and ``generate_feedback`` renders that notebook as it is, so students would read the hidden
    tests. This preprocessor deletes the ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``
    lines from each cell's source. A traceback of such a cell quotes the failing line, which may
    be hidden, so its error output is cut to ``AssertionError: Hint: ...`` (the exception type
    and message). Cells without hidden tests keep their full output.

    Only the grader's own test cells (graded, not solution cells: their source comes from the
    gradebook) are searched; a student's cell is the student's text, shown as written, so the
    marker words in it (a comment quoting them, a BEGIN without END) can neither break feedback
    nor hide anything. A test cell's region without its END line is removed to the cell's end.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("grade") or meta.get("solution"):
            return cell, resources
        removed = self._remove_hidden_test_region(cell)
        if removed and cell.cell_type == "code":
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    output.traceback = [f"{output.ename}: {output.evalue}", NOTE]
        return cell, resources


    def _remove_hidden_test_region(self, cell) -> bool:
        """Delete each line from a BEGIN marker to its END marker (or to the end), in place;
        True when something was deleted. Never raises: a nested BEGIN stays hidden."""
        kept, hidden, removed = [], False, False
        for line in cell.source.split("\n"):
            if self.begin_test_delimeter in line:
                hidden = removed = True
            elif self.end_test_delimeter in line:
                hidden = False
            elif not hidden:
                kept.append(line)
        cell.source = "\n".join(kept)
        return removed


class ExerciseFeedback(NbGraderPreprocessor):
    """Name each exercise and bring its hint forward, for the feedback template.

    Sets ``cell.metadata.autograder = {"title", "failed", "hint"}`` on each autograded test
    cell: the exercise's title (autograder.mistakes.exercise_titles: the ``# Test: ...`` line
    or the heading above), whether it lost points (nbgrader's GetGrades, which runs first, put
    the score there) and the hint it showed (the message of its error, as HideHiddenTests left
    it). The template ``autograder/templates/feedback/mlexp_feedback.html.j2`` shows the title
    in the score summary and the hint at the top and above the (collapsed) test code, escaped.
    The key is removed from every other cell, so a submitted notebook cannot fake it.
    """

    def preprocess(self, nb, resources):
        titles = exercise_titles(nb)
        for cell in nb.cells:
            cell.metadata.pop("autograder", None)
            if not is_test_cell(cell):
                continue
            meta = cell.metadata["nbgrader"]
            score, points = meta.get("score"), meta.get("points")
            failed = score is not None and points is not None and float(score) < float(points)
            cell.metadata["autograder"] = {
                "title": titles.get(meta.get("grade_id"), meta.get("grade_id", "")),
                "failed": failed,
                "hint": (hint_shown(cell) or "This test failed; the error below says how.")
                if failed else ""}
        return nb, resources


# Tags a lesson's markdown and a library's HTML output use; attributes on top of nh3's defaults.
_TAGS = nh3.ALLOWED_TAGS | {"tfoot"}
_ATTRIBUTES = {**{t: set(a) for t, a in nh3.ALLOWED_ATTRIBUTES.items()},
               "*": {"class", "id", "title", "lang", "dir"}}
_URL_SCHEMES = nh3.ALLOWED_URL_SCHEMES | {"data"}
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml);base64,[A-Za-z0-9+/=\s]*",
                         re.IGNORECASE)
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
# MathJax typesets TeX found in the page's text; these macros make links, classes, styles and
# ids out of it (\href{javascript:...}{x}). Each becomes \text, which shows its argument as text.
_TEX_MACROS = re.compile(r"\\(href|url|class|cssId|style|unicode|require|data|html)(?![A-Za-z])")
_KEPT_AS_IS = {"text/plain", "image/png", "image/jpeg", "image/svg+xml", "application/json"}


def _grader_names() -> tuple:
    """(classes, ids) the feedback template gives its own elements: read from the template
    (its ``class="..."`` and ``id="..."`` attributes, the values its expressions can write there
    and the ``mlexp-`` classes its style sheet names), so a new status element needs no list."""
    from .config import FEEDBACK_TEMPLATE, FEEDBACK_TEMPLATES
    text = (FEEDBACK_TEMPLATES / "feedback" / FEEDBACK_TEMPLATE).read_text(encoding="utf-8")
    classes = set()
    for value in re.findall(r'class="([^"]*)"', text):
        classes |= set(re.findall(r"'([\w-]+)'", value))   # literals of {{ 'a' if x else 'b' }}
        classes |= set(re.sub(r"\{\{.*?\}\}", " ", value).split())
    for style in re.findall(r"<style[^>]*>(.*?)</style>", text, re.S):   # not nbconvert's own
        classes |= set(re.findall(r"\.(mlexp-[\w-]*)", style))
    ids = {v for v in re.findall(r'id="([^"]*)"', text) if "{" not in v}
    return frozenset(classes), frozenset(ids)


_GRADER_CLASSES, _GRADER_IDS = _grader_names()


def _url_filter(tag: str, attr: str, value: str):
    """Keep a data: URL only as an image's source, and only for an image type; drop from a
    ``class`` the names of the grader's own elements (its status boxes, score table, hint) and
    an ``id`` the grader's page uses, so student HTML cannot pose as the grader's verdict."""
    if attr == "class":
        kept = [c for c in value.split() if c not in _GRADER_CLASSES and not c.startswith(
            ("mlexp-", "nbgrader"))]
        return " ".join(kept) or None
    if attr == "id" and (value in _GRADER_IDS or value.startswith(("mlexp-", "nbgrader"))):
        return None
    if attr in ("href", "src", "cite", "action") and value.strip().lower().startswith("data:"):
        return value if tag == "img" and attr == "src" and _DATA_IMAGE.fullmatch(value.strip()) \
            else None
    return value


def clean_html(html: str) -> str:
    """``html`` with everything that could run code removed, by nh3 (the Ammonia sanitiser).

    Kept: the tags and attributes of nh3's allow-list (headings, paragraphs, lists, tables,
    code, links, images) plus ``class``/``id``/``title`` on any tag, and images given as
    ``data:image/...;base64`` URLs. Removed: ``<script>``, ``<style>``, ``<iframe>``,
    ``<object>``, forms, every ``on...=`` event handler, ``style`` attributes, URLs with
    a scheme outside nh3's list (``javascript:``, ``vbscript:``, ``data:`` other than images),
    and the classes and ids of the grader's own page elements (see ``_url_filter``).
    TeX macros that MathJax would turn into links or styles are made plain text.
    """
    safe = nh3.clean(html, tags=_TAGS, attributes=_ATTRIBUTES, url_schemes=_URL_SCHEMES,
                     attribute_filter=_url_filter)
    return _TEX_MACROS.sub(r"\\text", safe)


def _markdown(source: str, attachments=None) -> str:
    renderer = IPythonRenderer(escape=False, attachments=attachments or {})
    return MarkdownWithMath(renderer=renderer).render(source)


def _one_html_block(html: str) -> str:
    """``html`` as one raw-HTML block that a markdown renderer passes through unchanged.

    A ``<div>`` block in markdown ends at the first blank line, so every newline that starts
    a blank line becomes the character reference ``&#10;`` (the same newline inside ``<pre>``,
    plain space elsewhere).
    """
    body = re.sub(r"\n(?=[ \t]*\n)", "&#10;", html.strip("\n"))
    return f"<div>\n{body}\n</div>" if body.strip() else "<div></div>"


def _clean_metadata(meta: dict) -> dict:
    """Output metadata the template writes into attributes: numbers and flags only."""
    out = {}
    for mime, value in (meta or {}).items():
        if not isinstance(value, dict):
            continue
        keep = {k: value[k] for k in ("width", "height")
                if isinstance(value.get(k), int) and not isinstance(value.get(k), bool)}
        keep.update({k: value[k] for k in ("unconfined",) if isinstance(value.get(k), bool)})
        keep.update({k: value[k] for k in ("alt",) if isinstance(value.get(k), str)})
        if keep:
            out[mime] = keep
    return out


class SanitizeFeedback(NbGraderPreprocessor):   # enabled by default, as nbgrader's own
    """Make a student's notebook safe to open as an HTML page: no script survives.

    Instructors open feedback pages, and a student writes their markdown cells and, through
    their code, their outputs (``display(HTML(...))``). Each markdown cell is rendered to HTML
    as nbconvert would and cleaned with :func:`clean_html`; math stays as TeX text for MathJax.
    In outputs, ``text/html`` is cleaned; ``text/markdown`` is rendered and cleaned; text,
    PNG and JPEG images (base64 checked), SVG (shown through ``<img>``, where scripts never
    run) and LaTeX (escaped by the template; link macros made text) are kept; everything that
    runs code (``application/javascript``, widget views) or that this step does not know is
    dropped. Output metadata is cut to numeric sizes and flags, since the template writes it
    into unquoted attributes. Raw cells are cleaned too.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "markdown":
            cell.source = _one_html_block(clean_html(_markdown(cell.source,
                                                               cell.get("attachments"))))
            cell.pop("attachments", None)
        elif cell.cell_type == "raw":
            cell.source = clean_html(cell.source)
        elif cell.cell_type == "code":
            for output in cell.get("outputs", []):
                if output.get("output_type") in ("display_data", "execute_result",
                                                  "update_display_data"):
                    self._clean_output(output)
        return cell, resources

    @staticmethod
    def _clean_output(output) -> None:
        data, kept = output.get("data", {}), {}
        for mime, value in data.items():
            text = "".join(value) if isinstance(value, list) else value
            if not isinstance(text, str):
                continue
            if mime in ("image/png", "image/jpeg"):
                if _BASE64.fullmatch(text):
                    kept[mime] = text
            elif mime in _KEPT_AS_IS:
                kept[mime] = text
            elif mime == "text/latex":
                kept[mime] = _TEX_MACROS.sub(r"\\text", text)
            elif mime == "text/html":
                kept[mime] = clean_html(text)
            elif mime == "text/markdown" and "text/html" not in data:
                kept["text/html"] = clean_html(_markdown(text))
        output["data"] = kept
        output["metadata"] = _clean_metadata(output.get("metadata"))
