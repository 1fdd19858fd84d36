"""The README and the guides in docs/ name only what exists (issue 42, item 5).

Every `python -m autograder SUBCOMMAND` written in a page (in a code block or in inline code) is a
subcommand of the grader's own argparse parser (``autograder.cli.parser()``), and every ``--flag``
written after it in the same command is an option of that subcommand (of its sub-subcommand, for
``canvas pull`` and ``canvas push``); every ``make TARGET`` is a target of the Makefile; every
relative link points at a file or folder that exists, and its ``#anchor``, for a Markdown page, at
one of that page's headings. ``problems`` is the checker; the tests run it on the course's pages
and on bad pages written for the purpose, so that it is seen to fail.
"""
import argparse
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[(?:[^\]]|\n)*?\]\(([^)\s]+)\)")
AUTOGRADER = re.compile(r"python -m autograder\s+(.*)")
MAKE = re.compile(r"(?:^|[\s;&(])make((?:\s+\S+)*)")
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")
TOP = "autograder|mlexp|scripts|tests|benchmarks|docs|solutions|lessons"
REPO_PATH = re.compile(rf"(?<![\w./-])((?:{TOP})/[\w./*<>-]*)")
# Paths the pages name that this repository does not hold on purpose: `publish` writes them into the
# student edition.
ELSEWHERE = {"mlexp/seed_tables/"}
DOTTED = re.compile(r"(?<![\w./-])((?:autograder|mlexp)(?:\.[A-Za-z_]\w*)+)")


def pages(repo: Path = REPO) -> list:
    """The README and every guide of docs/."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def make_targets(makefile: Path) -> set:
    """The targets the Makefile defines (rules and .PHONY names; not variable assignments)."""
    targets = set()
    for line in makefile.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.%/ -]+?)\s*::?(?!=)(.*)$", line)
        if not m or line.startswith("\t"):
            continue
        names = m.group(1).split()
        if names == [".PHONY"]:
            targets.update(m.group(2).split())
        else:
            targets.update(n for n in names if not n.startswith("."))
    return targets


def subcommands(parser: argparse.ArgumentParser) -> dict:
    """name -> parser of each subcommand of ``parser`` (empty when it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def grader_parser() -> argparse.ArgumentParser:
    from autograder.cli import parser
    return parser()


def _commands(text: str) -> list:
    """(line number, command) for every line of a fenced code block (lines ended with a backslash
    joined to the next, comments dropped) and every inline code span of the prose."""
    found = []
    for block in FENCE.finditer(text):
        start = text.count("\n", 0, block.start(1)) + 1
        joined, first = "", None
        for i, line in enumerate(block.group(1).splitlines()):
            first = start + i if first is None else first
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            found.append((first, (joined + line).split(" #")[0] if not (joined + line).lstrip().startswith("#")
                          else ""))
            joined, first = "", None
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for span in INLINE.finditer(prose):
        found.append((prose.count("\n", 0, span.start()) + 1, " ".join(span.group(1).split())))
    return found


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set:
    text = FENCE.sub("", page.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M)}


def _missing_path(repo: Path, path: str) -> bool:
    """Whether a repository path written in a page (``<id>`` and ``*`` read as any name) is absent."""
    pattern = re.sub(r"<[^>]*>", "*", path.rstrip(".,;:")).rstrip("/")
    return not any(repo.glob(pattern)) if pattern else False


def _missing_name(repo: Path, dotted: str) -> bool:
    """Whether ``autograder.x.y`` or ``mlexp.x.y`` names no module (or no name one module defines)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = repo.joinpath(*parts[:cut])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            rest = parts[cut:]
            return len(rest) > 1 or bool(rest) and not re.search(rf"\b{rest[0]}\b", source.read_text())
    return True


def problems(page_paths, parser: argparse.ArgumentParser, targets: set, repo: Path | None = None) -> list:
    """What the pages name that does not exist: one message per problem, 'page:line: what'. With
    ``repo``, also every repository path (``autograder/...``, ``tests/...``) and every dotted name
    of the grader or the library (``autograder.term.policy.load_final_grades``) written as code."""
    commands = subcommands(parser)
    out = []
    for page in page_paths:
        page = Path(page)
        text = page.read_text()
        name = page.name
        for line, command in _commands(text):
            for m in AUTOGRADER.finditer(command):
                words = m.group(1).split()
                if not words or not re.match(r"^[a-z][\w-]*$", words[0]):
                    continue
                sub = commands.get(words[0])
                if sub is None:
                    out.append(f"{name}:{line}: `python -m autograder {words[0]}` is no subcommand "
                               f"(there are: {', '.join(sorted(commands))})")
                    continue
                label = words[0]
                nested = subcommands(sub)
                if nested and len(words) > 1 and words[1] in nested:
                    sub, label = nested[words[1]], f"{words[0]} {words[1]}"
                elif nested and len(words) > 1 and re.match(r"^[a-z][\w-]*$", words[1]):
                    out.append(f"{name}:{line}: `python -m autograder {words[0]} {words[1]}` is no subcommand "
                               f"(there are: {', '.join(sorted(nested))})")
                    continue
                options = {s for a in sub._actions for s in a.option_strings}
                for flag in FLAG.findall(" ".join(words[1:])):
                    if flag.split("=")[0] not in options:
                        out.append(f"{name}:{line}: `python -m autograder {label}` has no option {flag}")
            if repo is not None:
                for path in REPO_PATH.findall(command):
                    if path not in ELSEWHERE and _missing_path(repo, path):
                        out.append(f"{name}:{line}: {path} is not in the repository")
                for dotted in DOTTED.findall(command):
                    if _missing_name(repo, dotted):
                        out.append(f"{name}:{line}: {dotted} names no module or name of the course")
            for m in MAKE.finditer(command):
                words = [w for w in m.group(1).split() if "=" not in w]
                if not words or not re.match(r"^[a-z][\w.-]*$", words[0]):
                    continue
                if words[0] not in targets:
                    out.append(f"{name}:{line}: `make {words[0]}` is no target of the Makefile")
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        prose = INLINE.sub(lambda m: " " * len(m.group(0)), prose)
        for m in LINK.finditer(prose):
            target = m.group(1)
            line = prose.count("\n", 0, m.start()) + 1
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):          # https:, mailto: and the like
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page.resolve()
            if not dest.exists():
                out.append(f"{name}:{line}: the link {target} points at {path}, which does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                out.append(f"{name}:{line}: the link {target}: {dest.name} has no heading #{anchor}")
    return out


@pytest.fixture(scope="module")
def grader():
    return grader_parser()


def test_the_pages_exist_and_the_readme_is_a_front_door():
    names = [p.relative_to(REPO).as_posix() for p in pages()]
    for guide in ("students", "instructors", "authors", "contributors", "troubleshooting"):
        assert f"docs/{guide}.md" in names
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for guide in ("students", "instructors", "authors", "contributors"):
        assert f"(docs/{guide}.md)" in readme
    # the two set-up commands stand first among the README's commands (.ci/run runs the second)
    first_block = FENCE.search(readme)
    assert readme.index("<!-- setup-commands -->") < first_block.start() < readme.index("<!-- /setup-commands -->")
    lines = [w for w in first_block.group(1).splitlines() if w.strip()]
    assert [w.split()[:2] for w in lines] == [["make", "grade"], ["make", "test"]]


def test_every_command_target_option_and_link_the_pages_name_exists(grader):
    targets = make_targets(REPO / "Makefile")
    assert {"grade", "test", "test-fast", "lessons", "check-generated", "book", "lab", "colab"} <= targets
    assert {"grade", "report", "export", "canvas", "publish", "build", "book"} <= set(subcommands(grader))
    assert problems(pages(), grader, targets, REPO) == []


def test_the_book_shows_every_guide():
    """Every page of docs/ is a page of the book (autograder/publishing/book.py, GUIDES), and a
    guide's links that leave docs/ lose their target there (the book holds no repository)."""
    from autograder.publishing.book import GUIDES, guide_page
    assert set(GUIDES) == {p.stem for p in (REPO / "docs").glob("*.md")}
    page = guide_page("[a](../README.md#the-lessons), [b](../autograder/README.md), [c](authors.md#colab),\n"
                      "[d\ne](../README.md#instructors) ![i](../x.png)")
    assert page == "[a](../index.md#the-lessons), b, [c](authors.md#colab),\nd\ne ![i](../x.png)"


@pytest.mark.timeout(30)
def test_a_guide_with_an_unclosed_bracket_becomes_a_page_at_once():
    """A half-open interval ("[0.5, 1)") followed by many lines is text, not a link to find by
    backtracking: each guide, and such a page, goes through guide_page in linear time (a pattern
    with two ways to match a newline took 25 minutes on docs/instructors.md)."""
    from autograder.publishing.book import GUIDES, guide_page
    for name in GUIDES:
        text = (REPO / "docs" / f"{name}.md").read_text(encoding="utf-8")
        assert guide_page(text).count("\n") == text.count("\n")
    page = "a ratio in [0.5, 1)" + "\n" * 60 + "[b](../README.md)"
    assert guide_page(page) == "a ratio in [0.5, 1)" + "\n" * 60 + "b"


BAD_PAGE = """# A bad page

Run `python -m autograder regrade DIR` or:

```bash
.venv/bin/python -m autograder grade SUBMISSIONS --out DIR --parallel 4   # a flag that is not there
.venv/bin/python -m autograder canvas fetch COURSE ASSIGNMENT
.venv/bin/python -m autograder canvas push DIR COURSE ASSIGNMENT --dry-run --no-such \\
    --out x
make test-slow SAMPLE=2
```

Good ones: `make grade SAMPLE=2`, `python -m autograder report DIR [--similarity 0.7]`, [here](#a-bad-page),
[the grader](autograder/cli.py), [the web](https://example.org/x). Bad ones: [gone](docs/nowhere.md),
[no heading](#no-such-heading), [elsewhere](other.md#nothing-there).
"""


def test_the_checker_names_each_bad_command_option_target_and_link(tmp_path, grader):
    (tmp_path / "autograder").mkdir()
    (tmp_path / "autograder" / "cli.py").write_text("")
    (tmp_path / "other.md").write_text("# Other\n")
    page = tmp_path / "bad.md"
    page.write_text(BAD_PAGE)
    found = problems([page], grader, make_targets(REPO / "Makefile"))
    expected = [
        "bad.md:3: `python -m autograder regrade` is no subcommand",
        "bad.md:6: `python -m autograder grade` has no option --parallel",
        "bad.md:7: `python -m autograder canvas fetch` is no subcommand",
        "bad.md:8: `python -m autograder canvas push` has no option --no-such",
        "bad.md:8: `python -m autograder canvas push` has no option --out",
        "bad.md:10: `make test-slow` is no target of the Makefile",
        "bad.md:14: the link docs/nowhere.md points at docs/nowhere.md, which does not exist",
        "bad.md:15: the link #no-such-heading: bad.md has no heading #no-such-heading",
        "bad.md:15: the link other.md#nothing-there: other.md has no heading #nothing-there",
    ]
    assert len(found) == len(expected), "\n".join(found)
    for message, start in zip(sorted(found), sorted(expected)):
        assert message.startswith(start), (message, start)


def test_the_checker_names_each_missing_path_and_name(tmp_path, grader):
    (tmp_path / "autograder" / "term").mkdir(parents=True)
    (tmp_path / "autograder" / "__init__.py").write_text("")
    (tmp_path / "autograder" / "term" / "__init__.py").write_text("")
    (tmp_path / "autograder" / "term" / "policy.py").write_text("def load_final_grades(d): ...\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_triton_a.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text("# P\n\n`autograder/term/policy.py`, `tests/test_triton_*.py`, `autograder/<x>/policy.py`,\n"
                    "`autograder.term.policy.load_final_grades(DIR)`, `autograder.term`.\n"
                    "`autograder/results.py`, `autograder.results.load_final_grades`,\n"
                    "`autograder.term.policy.final_grades`, `python -m autograder.termfile`.\n")
    found = problems([page], grader, set(), tmp_path)
    assert found == ["page.md:5: autograder/results.py is not in the repository",
                     "page.md:5: autograder.results.load_final_grades names no module or name of the course",
                     "page.md:6: autograder.term.policy.final_grades names no module or name of the course",
                     "page.md:6: autograder.termfile names no module or name of the course"], found


def test_a_good_page_has_no_problem(tmp_path, grader):
    page = tmp_path / "good.md"
    page.write_text("# Good\n\n`make test-fast`, `python -m autograder grade DIR --out X -j 2`, [top](#good).\n")
    assert problems([page], grader, make_targets(REPO / "Makefile")) == []


def test_make_targets_reads_rules_not_variables(tmp_path):
    makefile = tmp_path / "Makefile"
    makefile.write_text("PY := python\nOUT ?= x\n.PHONY: a b\na: setup\n\techo a: b\nsetup:\n\ttrue\n")
    assert make_targets(makefile) == {"a", "b", "setup"}
