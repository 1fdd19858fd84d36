"""Feedback pages without hidden tests or student scripts: preprocessors for generate_feedback.

Math is rendered to MathML when the page is written (latex2mathml), which browsers typeset
natively: a page needs no MathJax, no network and no script, so it reads the same offline or as
an LMS attachment. Figures are ``data:`` images inside the page.
"""
import html
import re

import nh3
from latex2mathml.converter import convert as _latex_to_mathml
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor

from autograder.cells import is_graded, is_solution, is_test_cell, nbgrader_meta
from autograder.mistakes import exercise_titles, hint_shown
from autograder.config import FEEDBACK_TEMPLATE, FEEDBACK_TEMPLATES
from autograder.ids import folder_name
from autograder.journal import atomic_write
from autograder.lms.base import LMSS

__all__ = ["HideHiddenTests", "ExerciseFeedback", "SanitizeFeedback", "clean_html", "tex_to_mathml"]

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
        if not is_graded(cell) or is_solution(cell):
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
            meta = nbgrader_meta(cell)
            score, points = meta.get("score"), meta.get("points")
            failed = score is not None and points is not None and float(score) < float(points)
            cell.metadata["autograder"] = {
                "title": titles.get(meta.get("grade_id"), meta.get("grade_id", "")),
                "failed": failed,
                "hint": (_error_hint(cell) or _partial_hint(score, points, hint_shown(cell)))
                if failed else ""}
        return nb, resources


def _error_hint(cell) -> str:
    """The hint of a test that failed with an error ("" when it raised none)."""
    errors = any(out.get("output_type") == "error" for out in cell.get("outputs", []))
    return hint_shown(cell) if errors else ""


def _partial_hint(score, points, printed="") -> str:
    """The hint of a test that lost points without an error: it ended in a partial score, and
    ``printed`` holds the hints it printed for the parts that failed (hint_shown)."""
    if score is not None and float(score) > 0:
        return (f"Partial credit: this test gave {float(score):g} of {float(points):g} points; "
                + (printed if printed else "its output below says what is missing."))
    return printed or "This test failed; the error below says how."


# MathML (what tex_to_mathml writes; MathML Core, which browsers render) and its presentation
# attributes: none of them is a link, a style or a script.
_MATHML_TAGS = {"math", "mrow", "mi", "mo", "mn", "ms", "mtext", "mspace", "msub", "msup",
                "msubsup", "mfrac", "msqrt", "mroot", "mstyle", "merror", "mpadded", "mphantom",
                "menclose", "munder", "mover", "munderover", "mtable", "mtr", "mtd",
                "mmultiscripts", "mprescripts", "none", "semantics", "annotation"}
_MATHML_ATTRIBUTES = {"display", "mathvariant", "stretchy", "fence", "form", "separator",
                      "lspace", "rspace", "width", "height", "depth", "columnalign", "rowalign",
                      "columnlines", "rowlines", "columnspacing", "rowspacing", "accent",
                      "accentunder", "movablelimits", "displaystyle", "scriptlevel",
                      "linethickness", "largeop", "symmetric", "minsize", "maxsize", "notation",
                      "encoding", "xmlns"}
# Tags a lesson's markdown and a library's HTML output use; attributes on top of nh3's defaults.
_TAGS = nh3.ALLOWED_TAGS | {"tfoot"} | _MATHML_TAGS
_ATTRIBUTES = {**{t: set(a) for t, a in nh3.ALLOWED_ATTRIBUTES.items()},
               **{t: set(_MATHML_ATTRIBUTES) for t in _MATHML_TAGS},
               "*": {"class", "id", "title", "lang", "dir"}}
_URL_SCHEMES = nh3.ALLOWED_URL_SCHEMES | {"data"}
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml);base64,[A-Za-z0-9+/=\s]*",
                         re.IGNORECASE)
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
# TeX macros that make links, classes, styles and ids (\href{javascript:...}{x}), in MathJax
# and in MathML converters alike. Each becomes \text, which shows its argument as text: in TeX
# before tex_to_mathml converts it, and in whatever TeX is left as text in a page.
_TEX_MACROS = re.compile(r"\\(href|url|class|cssId|style|unicode|require|data|html)(?![A-Za-z])")
_KEPT_AS_IS = {"text/plain", "image/png", "image/jpeg", "image/svg+xml", "application/json"}


def _grader_names() -> tuple:
    """(classes, ids) the feedback template gives its own elements: read from the template
    (its ``class="..."`` and ``id="..."`` attributes, the values its expressions can write there
    and the ``mlexp-`` classes its style sheet names), so a new status element needs no list."""
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


def tex_to_mathml(tex: str, display: bool = False) -> str:
    """TeX math (without its ``$`` delimiters) as a MathML ``<math>`` element, by latex2mathml.

    The result is not yet safe (``\\text{<b>}`` passes its text through): callers clean it
    with :func:`clean_html`. TeX that latex2mathml cannot read is kept as code text,
    ``<code class="tex">...</code>``, escaped, so the page still shows what was written.
    """
    tex = _TEX_MACROS.sub(r"\\text", tex)
    try:
        return _latex_to_mathml(tex, display="block" if display else "inline")
    except Exception:   # noqa: BLE001 (latex2mathml raises many types for TeX it lacks)
        return f'<code class="tex">{html.escape(tex.strip())}</code>'


class _MathMLRenderer(IPythonRenderer):
    """nbconvert's markdown renderer with math written as MathML instead of TeX for MathJax."""

    def block_math(self, body: str) -> str:
        return tex_to_mathml(body, display=True)

    def inline_math(self, body: str) -> str:
        return tex_to_mathml(body)

    def latex_environment(self, name: str, body: str) -> str:
        return tex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)


def _markdown(source: str, attachments=None) -> str:
    renderer = _MathMLRenderer(escape=False, attachments=attachments or {})
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
    as nbconvert would and cleaned with :func:`clean_html`. In outputs, ``text/html`` is cleaned; ``text/markdown`` is rendered and cleaned; text,
    PNG and JPEG images (base64 checked) and SVG (shown through ``<img>``, where scripts never
    run) are kept, LaTeX is rendered to MathML; everything that
    runs code (``application/javascript``, widget views) or that this step does not know is
    dropped. Output metadata is cut to numeric sizes and flags, since the template writes it
    into unquoted attributes. Raw cells are cleaned too. Math (``$...$``, ``$$...$$``,
    ``\\begin{...}``), in markdown and in LaTeX outputs, becomes MathML (:func:`tex_to_mathml`)
    before the cleaning, so the page typesets it without MathJax or a network.
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
            elif mime == "text/latex" and "text/html" not in data:   # e.g. sympy's $x^2$
                kept["text/html"] = clean_html(_markdown(text))
            elif mime == "text/html":
                kept[mime] = clean_html(text)
            elif mime == "text/markdown" and "text/html" not in data:
                kept["text/html"] = clean_html(_markdown(text))
        output["data"] = kept
        output["metadata"] = _clean_metadata(output.get("metadata"))


# ------------------------------------------------------------- the final grade on the page

GRADE_BOX_START, GRADE_BOX_END = "<!-- mlexp-final-grade -->", "<!-- /mlexp-final-grade -->"
_GRADE_BOX = re.compile(re.escape(GRADE_BOX_START) + ".*?" + re.escape(GRADE_BOX_END), re.DOTALL)
# Its look (div.mlexp-final) is in the template's <style>: the box adds no element of its own
# beyond a div, a list and text, so a page stays as safe as the template made it.


_RUBRIC_TAG = re.compile(r"^\[rubric r\d+\] ")   # autograder.reporting.rubric's tag: the grader's, not the student's


def _said(comment: str) -> str:
    """An instructor's comment as the student reads it (a rubric item's tag left out)."""
    return _RUBRIC_TAG.sub("", comment or "")


def grade_box(row, titles=None) -> str:
    """The HTML box a feedback page shows above its exercises: the lesson's final score, the
    tests' score, the late penalty and the instructor's overrides (with their comments), all
    escaped. ``row``: an autograder.results.FinalGrade; ``titles``: {grade_id: title} of its
    lesson's exercises (an override names its exercise by title where known, else by grade id).
    Holds no test code and no answer."""
    import html
    e = html.escape
    items = [f"<li class='raw'>Tests: {row.machine_score:g} of {row.max_score:g} points</li>"]
    for o in row.overrides:
        if getattr(o, "keep", False):   # a decision of its own: the tests' score stands
            said = f": {e(_said(o.comment))}" if _said(o.comment) else ""
            who = f" ({e(o.by)})" if o.by else ""
            items.append(f"<li class='override kept'>Reviewed by your instructor{who}, who "
                         f"kept the tests' score{said}</li>")
            continue
        title = (titles or {}).get(o.exercise)
        name = f"&ldquo;{e(title)}&rdquo;" if title and title != o.exercise else \
            f"<code>{e(o.exercise)}</code>"
        what = f"exercise {name} set to" if o.exercise else "lesson total set to"
        said = f": {e(_said(o.comment))}" if _said(o.comment) else ""
        who = f" ({e(o.by)})" if o.by else ""
        items.append(f"<li class='override'>Changed by your instructor{who}: {what} "
                     f"{o.points:g} point{'s' * (o.points != 1)}{said}</li>")
    if row.late_note and row.days_late:
        items.append(f"<li class='late'>Late work: {e(row.late_note)}</li>")
    # an unknown submission time ("Canvas marked it _LATE_ ...: no late penalty applied") is the
    # instructor's to read in the report, not the student's: Canvas's own late policy may apply
    for o in () if row.overrides else getattr(row, "stale", ()):   # decided again: the new decision says it
        what = f"exercise {e(o.exercise)} set to {o.points:g}" if o.exercise and not o.keep \
            else "the tests' score kept" if o.keep else f"lesson total set to {o.points:g}"
        items.append(f"<li class='stale'>Your instructor's decision on an earlier attempt "
                     f"({what}) does not apply to this one; the score may change when they "
                     "look at it.</li>")
    if row.status.kind in ("needs manual review", "timed out") and row.review == "undecided":
        items.append("<li class='review'>Your instructor will look at this submission; the "
                     "score may change.</li>")
    return (f"{GRADE_BOX_START}<div class='mlexp-final' id='mlexp-final'>"
            f"<strong>Your grade for {e(row.assignment)}: <span class='final-score'>"
            f"{row.score:g}</span> of {row.max_score:g} points</strong>"
            f"<ul>{''.join(items)}</ul></div>{GRADE_BOX_END}")


_TESTS_SCORE = re.compile(r'(<span class="mlexp-tests-score" data-tests="([^"]*)">)(.*?)(</span>)')
_EXERCISE_SCORE = re.compile(r'(<(td|span) class="(?:score|mlexp-points)" data-grade-id="([^"]*)" '
                             r'data-tests="([^"]*)">)(.*?)(</\2>)')


_MARK = re.compile(r'(<td class="mark" data-grade-id="([^"]*)" data-tests="([^"]*)">)(.*?)(</td>)')
_DECIDED = re.compile(r'<div class="mlexp-decided" data-grade-id="[^"]*">.*?</div>', re.DOTALL)
_VERDICT = re.compile(r'<div class="(mlexp-hint|mlexp-ok)"([^>]*?)( hidden)?>')   # attributes in any order
_GRADE_ID = re.compile(r' data-grade-id="([^"]*)"')


def _decided(page: str, overrides: dict) -> str:
    """``page`` with each overridden exercise (``overrides``: {escaped grade id: Override}) saying
    the decision where the tests' verdict was: its mark a pencil, the "What to fix" or "Passed."
    box hidden behind a box that gives the points set and the instructor's comment, so nothing on
    the page contradicts the grade. Undone first, so a decision removed puts the verdict back."""
    import html
    page = _DECIDED.sub("", page)
    page = _VERDICT.sub(lambda m: f'<div class="{m.group(1)}"{m.group(2)}>', page)
    page = _MARK.sub(lambda m: m.group(1) + ("✎" if m.group(2) in overrides else m.group(3)) + m.group(5), page)

    def verdict(m):
        gid = _GRADE_ID.search(m.group(2))
        o = overrides.get(gid.group(1)) if gid else None
        if o is None:
            return m.group(0)
        said = f" {html.escape(_said(o.comment))}" if _said(o.comment) else ""
        who = f" ({html.escape(o.by)})" if o.by else ""
        return (f'<div class="mlexp-decided" data-grade-id="{gid.group(1)}"><strong>Decided by your instructor'
                f'{who}</strong><p>{o.points:g} point{"s" * (o.points != 1)}.{said}</p></div>'
                f'<div class="{m.group(1)}"{m.group(2)} hidden>')
    return _VERDICT.sub(verdict, page)


def _one_score(page: str, row) -> str:
    """``page`` showing one score: with ``row`` (a FinalGrade whose box the page carries), the
    notebook heading drops nbgrader's tests-only score (the box under it holds the grade) and an
    exercise the instructor overrode shows the override's points where the tests' were, and the
    decision where the tests' verdict was (:func:`_decided`); with None, the tests' scores and
    verdicts are put back. Only the template's own marked elements are touched."""
    import html
    overrides = {html.escape(o.exercise): o for o in (row.overrides if row else ()) if o.exercise}
    page = _TESTS_SCORE.sub(lambda m: m.group(1) + ("" if row else m.group(2)) + m.group(4), page)
    page = _decided(page, overrides)

    def exercise(m):
        o = overrides.get(m.group(3))
        if o is None:
            return m.group(1) + m.group(4) + m.group(6)
        out_of = m.group(4).split("/")[-1].strip()
        return f"{m.group(1)}{o.points:g} / {out_of} (set by your instructor){m.group(6)}"
    return _EXERCISE_SCORE.sub(exercise, page)


_HEADLINE = re.compile(r"<strong>Your grade for .*?</strong>", re.DOTALL)


def gradebook_page(page: str, lesson: str, grade: str, points: str, lms: str) -> str:
    """``page`` (a feedback page's HTML) as the gradebook shows its grade: the headline of the
    grade box says ``grade`` of ``points`` (the LMS column's scale, the text export wrote into the
    gradebook) and the lesson's own points under it; a page without a box gets one holding just
    that. nbgrader's tests-only heading score goes either way, so the page shows one grade, the
    one the student sees in the LMS. ``points``: the column's points possible, written as the
    grade is (a decimal comma where the gradebook has one). ``lms``: an LMS's name (autograder.lms.base.LMSS)."""
    import html
    e = html.escape
    where = LMSS[lms].title if lms in LMSS else lms
    headline = (f"<strong>Your grade for {e(lesson)} in {e(where)}: <span class='lms-score'>"
                f"{e(grade)}</span> of {e(points)}</strong>")
    found = _HEADLINE.search(page) if GRADE_BOX_START in page else None
    if found:
        said, start = found.group(0), found.group(0).find("<span class='final-score'>")
        new = headline if start < 0 else (          # < 0: a page this made already
            f"{headline}<p class='lesson-points'>In lesson points: "
            f"{said[start:].removesuffix('</strong>')}</p>")
        return page[:found.start()] + new + page[found.end():]
    box = (f"{GRADE_BOX_START}<div class='mlexp-final' id='mlexp-final'>{headline}"
           f"</div>{GRADE_BOX_END}")
    page = _TESTS_SCORE.sub(lambda m: m.group(1) + m.group(4), page)
    if "</h4>" in page:
        return page.replace("</h4>", "</h4>" + box, 1)
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + box, page, count=1)


def write_grade_boxes(out, rows, titles=None) -> list:
    """Put :func:`grade_box` of each row into its feedback pages (``titles``: {lesson:
    {grade_id: title}}, for the overrides' exercise names)
    (``out/feedback/<student>/<lesson>/*.html``), replacing the box an earlier run wrote (or
    placing it right after the page's first heading). A row with nothing to say (its lesson
    has no due date, no override, no pending review) gets no box (an old one is removed).
    No kernel runs; returns the pages written. Raises OSError when a page cannot be written."""
    from pathlib import Path

    written = []
    for row in rows:
        said = row.due or row.overrides or row.days_late or row.review == "undecided" or \
            getattr(row, "stale", None)
        box = grade_box(row, (titles or {}).get(row.assignment)) if said else ""   # no term and no decision: the page as graded
        for page in sorted((Path(out) / "feedback" / folder_name(row.student) / row.assignment)
                           .glob("*.html")):
            text = page.read_text(encoding="utf-8")
            if not box and GRADE_BOX_START not in text:
                continue
            if GRADE_BOX_START in text:
                new = _GRADE_BOX.sub(lambda _: box, text, count=1)
            elif "</h4>" in text:
                new = text.replace("</h4>", "</h4>" + box, 1)
            else:
                new = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + box, text, count=1)
            new = _one_score(new, row if box else None)
            if new != text:
                atomic_write(page, new)
                written.append(page)
    return written
