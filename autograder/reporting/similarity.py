"""Similar answers across a class, found by copydetect's winnowing fingerprints: worth a look.

copydetect (PyPI ``copydetect``, in the grade extra) implements winnowing (Schleimer, Wilkerson
and Aiken, "Winnowing: local algorithms for document fingerprinting", SIGMOD 2003), the method
behind MOSS: code is tokenised with Pygments, names become placeholders (so renaming variables
changes nothing), and hashed k-grams of the token text are thinned to a few fingerprints per
window. Two answers share code where they share fingerprints. Each student's answer cells of a
lesson are compared as one text. Code that is also in the released skeleton of those cells
(signatures, docstrings, ``raise NotImplementedError()``) never counts, and neither does code
that is also in the reference solution: a short exercise has one natural correct answer, and
two students who both wrote it have not copied each other. What is left, and compared, is the
code each student wrote their own way; two students sharing long runs of it is worth a look.

A high score says two answers share long runs of code, nothing more: short exercises and the
one obvious correct solution make honest answers alike. The report presents pairs as worth a
look, never as a verdict.
"""
import hashlib
import html
import io
import json
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path

from autograder.journal import atomic_write

__all__ = ["Pair", "similar_pairs", "THRESHOLD", "MIN_SHARED", "available", "SIMILAR_FILE", "save_pairs",
           "load_pairs", "marked_html"]

SIMILAR_FILE = "similar.json"   # the pairs of the last report, for the review page

THRESHOLD = 0.8     # both answers share at least this fraction of their (non-skeleton) code
MIN_SHARED = 60     # ... and at least this many characters of tokenised code (not one-liners)
NOISE = 25          # k: shortest shared run (characters of tokenised code) that counts
GUARANTEE = 30      # every shared run this long is found (window = GUARANTEE - NOISE + 1)


@dataclass
class Pair:
    """Two students whose answers share code: fractions of each one's code that is shared,
    their answers as text and the shared character ranges ([(start, end)]) in each."""
    assignment: str
    a: str
    b: str
    score_a: float
    score_b: float
    code_a: str
    code_b: str
    shared_a: list
    shared_b: list

    @property
    def score(self) -> float:
        return min(self.score_a, self.score_b)

    @property
    def digest(self) -> str:
        """A mark of both answers as compared: a decision on the pair holds until either changes."""
        return hashlib.sha256(json.dumps([self.code_a, self.code_b]).encode()).hexdigest()[:16]


def save_pairs(out: Path, pairs: dict) -> None:
    """Write {assignment: [Pair]} to ``out/similar.json`` (the review page's queue reads it)."""
    atomic_write(Path(out) / SIMILAR_FILE, json.dumps(
        [asdict(p) for a in sorted(pairs) for p in pairs[a]], indent=1))


def marked_html(code: str, spans: list) -> str:
    """``code`` escaped for HTML, with the shared character ranges ``spans`` ([(start, end)], sorted) in <mark>."""
    parts, at = [], 0
    for start, end in spans:
        parts += [html.escape(code[at:start]), "<mark>", html.escape(code[start:end]), "</mark>"]
        at = end
    return "".join(parts) + html.escape(code[at:])


def load_pairs(out: Path) -> list:
    """The pairs :func:`save_pairs` wrote into ``out`` ([] when none were)."""
    try:
        data = json.loads((Path(out) / SIMILAR_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [Pair(**{**d, "shared_a": [tuple(r) for r in d["shared_a"]],
                    "shared_b": [tuple(r) for r in d["shared_b"]]}) for d in data]


def available() -> bool:
    """True when copydetect can be imported (it comes with the grade extra)."""
    try:
        import copydetect  # noqa: F401
    except ImportError:
        return False
    return True


def _fingerprint(code: str, excluded=frozenset()):
    """copydetect's fingerprint of ``code`` without the hashes in ``excluded``. (copydetect's
    own ``boilerplate`` argument assumes unique hashes, which winnowing does not give, and
    keeps some boilerplate; the hashes are dropped here and the coverage recounted.)"""
    from copydetect import CodeFingerprint
    from copydetect.utils import get_token_coverage
    fp = CodeFingerprint("answer.py", NOISE, GUARANTEE - NOISE + 1, language="python",
                         fp=io.StringIO(code))
    if excluded:
        fp.hashes = fp.hashes - excluded
        fp.hash_idx = {h: i for h, i in fp.hash_idx.items() if h not in excluded}
        fp.token_coverage = get_token_coverage(fp.hash_idx, fp.k, len(fp.filtered_code))
    return fp


def similar_pairs(assignment: str, answers: dict, exclude=(), threshold: float = THRESHOLD,
                  min_shared: int = MIN_SHARED) -> list:
    """Pairs of students of one lesson whose answers share at least ``threshold`` of each one's
    code, highest score first.

    ``answers``: student id -> the text of their answer cells; ``exclude``: texts whose code
    never counts (the released skeleton of those cells, the reference solution). A pair also
    needs ``min_shared`` characters of shared tokenised code. Quadratic in the number of
    students (a class of 500 is about 125,000 comparisons of small texts). Raises ImportError
    when copydetect is missing.
    """
    from copydetect import compare_files

    excluded = frozenset().union(*(_fingerprint(text).hashes for text in exclude if text.strip()))
    prints = {s: _fingerprint(code, excluded) for s, code in sorted(answers.items())
              if code.strip()}
    pairs = []
    for a, b in combinations(sorted(prints), 2):
        fa, fb = prints[a], prints[b]
        if not fa.token_coverage or not fb.token_coverage:
            continue
        shared, (sim_a, sim_b), (slices_a, slices_b) = compare_files(fa, fb)
        if shared < min_shared or min(sim_a, sim_b) < threshold:
            continue
        pairs.append(Pair(assignment, a, b, float(sim_a), float(sim_b), fa.raw_code, fb.raw_code,
                          _ranges(slices_a), _ranges(slices_b)))
    return sorted(pairs, key=lambda p: (-p.score, p.a, p.b))


def _ranges(slices) -> list:
    """copydetect's 2 x N array of slice starts and ends as [(start, end)], merged and sorted."""
    spans = sorted((int(s), int(e)) for s, e in zip(*slices)) if len(slices) and len(slices[0]) else []
    merged = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged
