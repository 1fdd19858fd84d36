"""Canvas through its REST API (the ``canvasapi`` client, the grader's ``canvas`` extra).

``python -m autograder canvas pull COURSE ASSIGNMENT --out SUBMISSIONS`` downloads each
student's latest attempt and ``canvas push DIR COURSE ASSIGNMENT`` posts the decided grades and
feedback pages back (autograder.term.canvas_sync). This module holds what both share: the token, the
connection, and one bounded way of calling Canvas.

- **Token**: from the environment variable ``CANVAS_TOKEN`` or a file (``--token-file``) that
  only its owner can read (mode 600); it is never printed, logged or put in an error message
  (every message passes :func:`Session.redact`, canvasapi's own logger is kept quiet).
- **Calls**: :meth:`Session.call` runs one request (or one whole paginated listing, which
  canvasapi follows through the ``Link: <...>; rel="next"`` headers) and retries it up to
  ``retries`` times, waiting ``backoff`` seconds doubled each time (capped at 30 s), when Canvas
  answers 403 "Rate Limit Exceeded" or 429, a 5xx, or the network fails. When Canvas's cost
  header ``X-Rate-Limit-Remaining`` falls below :data:`LOW_QUOTA` it waits before the next call.
  Every other refusal becomes a :class:`CanvasError` that says what to fix: an expired or revoked
  token (401 with ``WWW-Authenticate``), no permission (401/403), an unknown course or
  assignment (404). Retries that run out raise :class:`CanvasCut`: the run stops, everything
  already done stays done, and the same command resumes.
"""
from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

__all__ = ["TOKEN_ENV", "URL_ENV", "INSTALL", "CanvasError", "CanvasCut", "MissingExtra",
           "read_token", "require_canvasapi", "Session", "LOW_QUOTA"]

TOKEN_ENV = "CANVAS_TOKEN"
URL_ENV = "CANVAS_URL"
INSTALL = ("the canvas commands need the grader's canvas extra: .venv/bin/pip install -e "
           "'./autograder[canvas]' (or .venv/bin/pip install canvasapi)")
BACKOFF_S = 2.0         # the first wait before a retry, doubled each time up to MAX_WAIT_S
LOW_QUOTA = 50.0        # X-Rate-Limit-Remaining below this: pause before the next call
MAX_WAIT_S = 30.0
TOKEN_HOW = ("make one in Canvas under Account > Settings > Approved Integrations > "
             "+ New Access Token, as a teacher or TA of the course (it acts with that user's "
             "rights: it must be able to see submissions and grade)")


class CanvasError(ValueError):
    """Canvas refused something, or the command cannot reach it: the message names what to fix."""


class CanvasCut(CanvasError):
    """Canvas stopped answering after the bounded retries; what was done is kept, run again."""


class MissingExtra(ImportError):
    """canvasapi is not installed: the message says how to install the canvas extra."""


def require_canvasapi():
    """The canvasapi module; raises MissingExtra (with :data:`INSTALL`) when it is absent."""
    try:
        import canvasapi
    except ImportError:
        raise MissingExtra(INSTALL) from None
    return canvasapi


def read_token(token_file=None, environ=None) -> str:
    """The API token: the text of ``token_file`` (which must be readable by its owner only),
    else the environment variable CANVAS_TOKEN. Raises CanvasError saying how to provide one;
    the message never holds the token."""
    environ = os.environ if environ is None else environ
    if token_file:
        path = Path(token_file)
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise CanvasError(f"--token-file {path}: cannot read it ({exc.strerror})") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise CanvasError(f"--token-file {path} can be read by other users (mode "
                              f"{stat.S_IMODE(mode):03o}): run chmod 600 {path}, and make a "
                              "new token if others may have read it")
        token = path.read_text(encoding="utf-8", errors="replace").strip()
        if not token:
            raise CanvasError(f"--token-file {path} is empty: write the token into it; {TOKEN_HOW}")
        return token
    token = (environ.get(TOKEN_ENV) or "").strip()
    if not token:
        raise CanvasError(f"no Canvas token: set {TOKEN_ENV} or give --token-file FILE "
                          f"(chmod 600); {TOKEN_HOW}")
    return token


def _network_errors() -> tuple:
    import requests
    return (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


class Session:
    """A Canvas at ``url`` reached with ``token``, every request through :meth:`call`.

    ``retries``: tries after the first (bounded); ``backoff``: the first wait in seconds
    (default BACKOFF_S); ``sleep``: how to wait (default time.sleep); ``say``: where notes on
    retries go (a callable taking one line; they never hold the token). Raises MissingExtra
    without canvasapi, CanvasError for a missing or non-https address."""

    def __init__(self, url: str, token: str, retries: int = 4, backoff: float = None,
                 sleep=None, say=None):
        canvasapi = require_canvasapi()
        if not url:
            raise CanvasError(f"no Canvas address: give --url https://canvas.example.edu or set "
                              f"{URL_ENV}")
        from urllib.parse import urlsplit
        parts = urlsplit(url)
        loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
        if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
            raise CanvasError(f"--url {url!r}: write the Canvas address with https://, as in "
                              "https://canvas.example.edu (the token is never sent unencrypted; "
                              "http:// only to this machine)")
        logging.getLogger("canvasapi").setLevel(logging.WARNING)   # its debug lines show headers
        self.url = url.rstrip("/")
        self._token = token
        import warnings
        with warnings.catch_warnings():   # http:// to this machine only (a test's stand-in)
            warnings.simplefilter("ignore", UserWarning)
            self.canvas = canvasapi.Canvas(self.url, token)
        self.host = parts.netloc
        self.retries = max(0, int(retries))
        self.backoff = float(BACKOFF_S if backoff is None else backoff)
        self.sleep = sleep or time.sleep
        self.say = say or (lambda line: None)
        self.requests = 0

    @property
    def requester(self):
        """canvasapi's Requester (for an upload, which canvasapi makes through it)."""
        return self.canvas._Canvas__requester

    def redact(self, text) -> str:
        """``text`` with the token (and its Bearer header) replaced by ``****``."""
        return str(text).replace(self._token, "****") if self._token else str(text)

    def download(self, url: str) -> bytes:
        """The bytes at a file's ``url`` (a File's download address); the token goes along only
        when the address is on the Canvas host itself (requests drops it on a redirect to
        another host, such as Canvas's file store)."""
        from urllib.parse import urlsplit
        same = urlsplit(url).netloc == self.host
        return self.requester.request("GET", _url=url, use_auth=same).content

    def _last_headers(self) -> dict:
        cache = getattr(self.requester, "_cache", None) or []
        return dict(cache[0].headers) if cache else {}

    def _pace(self) -> None:
        """Wait a little when the last answer's X-Rate-Limit-Remaining is low."""
        try:
            left = float(self._last_headers().get("X-Rate-Limit-Remaining", "inf"))
        except ValueError:
            return
        if left < LOW_QUOTA:
            self.sleep(min(MAX_WAIT_S, self.backoff))

    def call(self, what: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, retried on rate limits, 5xx and network failures at most
        ``retries`` times. ``what`` names the step for messages ("list the submissions of
        assignment 7 in course 3"). Raises CanvasError for a refusal, CanvasCut when the
        retries run out."""
        from canvasapi import exceptions as ce
        network = _network_errors()
        wait, last = self.backoff, ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.say(f"  Canvas: {what}: {last}; try {attempt + 1} of {self.retries + 1} "
                         f"in {wait:g} s")
                self.sleep(wait)
                wait = min(MAX_WAIT_S, wait * 2)
            self.requests += 1
            try:
                out = fn(*args, **kwargs)
                self._pace()
                return out
            except ce.InvalidAccessToken:
                raise CanvasError(f"Canvas refused the token ({what}): it has expired or was "
                                  f"deleted; {TOKEN_HOW}") from None
            except ce.RateLimitExceeded:
                last = "rate limit exceeded"
            except (ce.Unauthorized, ce.Forbidden) as exc:
                if "rate limit exceeded" in str(exc).lower():
                    last = "403 Rate Limit Exceeded"
                    wait = max(wait, self._cost_wait())
                    continue
                raise CanvasError(f"Canvas says the token's user may not {what}: give that user "
                                  "a teacher or TA role in the course (one that may see "
                                  "submissions and grade), or use a token of such a user") from None
            except ce.ResourceDoesNotExist:
                raise CanvasError(f"Canvas found nothing to {what}: check the number (it is the "
                                  "one in the course's or assignment's address, .../courses/"
                                  "COURSE/assignments/ASSIGNMENT) and that the token's user is "
                                  "in the course") from None
            except (ce.BadRequest, ce.UnprocessableEntity, ce.Conflict) as exc:
                raise CanvasError(f"Canvas refused to {what}: {self.redact(exc)[:300]}") from None
            except ce.CanvasException as exc:   # "Encountered an error: status code 5xx"
                last = self.redact(exc)[:200]
            except network as exc:
                last = f"network failure ({type(exc).__name__})"
        raise CanvasCut(f"Canvas did not answer to {what} after {self.retries + 1} tries "
                        f"({last}); what was done is kept: run the same command again to go on")

    def _cost_wait(self) -> float:
        """Seconds to wait after a 403 rate limit: longer the more of the quota was used."""
        try:
            cost = float(self._last_headers().get("X-Request-Cost", "0"))
        except ValueError:
            cost = 0.0
        return min(MAX_WAIT_S, self.backoff + cost)

    def assignment(self, course_id, assignment_id):
        """(course, assignment) canvasapi objects; raises CanvasError naming what was not found."""
        course = self.call(f"read course {course_id}", self.canvas.get_course, course_id)
        assignment = self.call(f"read assignment {assignment_id} of course {course_id}",
                               course.get_assignment, assignment_id)
        return course, assignment

    def listing(self, what: str, paginated, limit: int = 20000) -> list:
        """Every item of a canvasapi PaginatedList (its Link rel="next" pages), at most ``limit``,
        read through :meth:`call` (a failed page reads the listing again, whole)."""
        from itertools import islice
        return self.call(what, lambda: list(islice(paginated, limit)))
