"""A stand-in Canvas on 127.0.0.1 for the canvas pull/push tests (no internet).

It serves, in a thread, the endpoints autograder.term.canvas_sync uses, with the shapes of Canvas's
REST API documentation (canvas.instructure.com/doc/api):

- Courses: ``GET /api/v1/courses/:id`` -> Course ``{id, name, course_code}``.
- Assignments: ``GET /api/v1/courses/:course_id/assignments/:id`` -> Assignment ``{id,
  course_id, name, points_possible, submission_types, due_at}``.
- Submissions: ``GET .../assignments/:id/submissions`` (``include[]=user``,
  ``include[]=submission_comments``; ``per_page``, capped at ``page_size`` as Canvas caps it at
  100, pages linked by ``Link: <...>; rel="next"``, as "Pagination" documents) and
  ``GET .../submissions/:user_id`` -> Submission ``{id, assignment_id, user_id, attempt,
  submitted_at, late, workflow_state, submission_type, score, grade, entered_score,
  attachments: [File], user: User {id, name, sortable_name, login_id}, submission_comments:
  [SubmissionComment {id, author_id, comment, created_at, attachments}]}``;
  ``PUT .../submissions/:user_id`` with ``submission[posted_grade]``, ``comment[text_comment]``,
  ``comment[file_ids][]`` (form-encoded) grades and comments ("Grade or comment on a submission").
- Uploads, "File Upload Process": ``POST .../submissions/:user_id/comments/files`` (``name``,
  ``size``) -> ``{upload_url, upload_params}``; step 2, a multipart POST to ``upload_url``
  (no token) -> ``302`` to ``/api/v1/files/:id/create_success?uuid=...``; step 3, the GET
  there confirms and returns the File ``{id, display_name, filename, size, url,
  content-type}``. A File's ``url`` downloads its bytes.
- Errors as Canvas answers them: 401 with ``WWW-Authenticate`` for an invalid token, 401
  ``user not authorized to perform that action`` for a token without rights, 404
  ``{"errors": [{"message": "The specified resource does not exist."}]}``, and the throttle's
  ``403 Forbidden (Rate Limit Exceeded)`` with ``X-Rate-Limit-Remaining`` and
  ``X-Request-Cost`` headers (every answer carries them).

Faults for the tests: ``rate_limit`` (the next N API requests are throttled), ``down_after_puts``
(after that many grade/comment PUTs, the next PUT is applied and then every request's
connection is dropped unanswered, as a network cut does, until ``down`` is set False),
``down_after_downloads`` (the same after that many file downloads) and ``lose_answers_of_puts``
(those PUTs are applied and their answer is lost, once).
"""
from __future__ import annotations

import json
import re
import threading
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

API = "/api/v1"


class StandIn:
    """The stand-in's state and server. ``url`` is its base address once started."""

    def __init__(self, token: str, course_id: int = 3, page_size: int = 10):
        self.token, self.course_id, self.page_size = token, course_id, page_size
        self.student_tokens = set()      # tokens of users with no right to see or grade
        self.users, self.assignments, self.submissions, self.files = {}, {}, {}, {}
        self.log = []                    # (method, path) of every request answered or dropped
        self.rate_limit = 0
        self.down_after_puts, self.puts, self.down = None, 0, False
        self.down_after_downloads, self.downloads = None, 0
        self.lose_answers_of_puts = set()   # these PUTs (1-based) are applied, their answer lost
        self._ids = iter(range(5000, 10**6))
        self._lock = threading.RLock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "StandIn":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---------------------------------------------------------------- content for a test
    def add_assignment(self, aid: int, name: str, points: float) -> None:
        self.assignments[aid] = {"id": aid, "course_id": self.course_id, "name": name,
                                 "points_possible": points, "due_at": None,
                                 "submission_types": ["online_upload"]}

    def add_user(self, uid: int, name: str, login: str) -> None:
        last, first = name.split()[-1], " ".join(name.split()[:-1])
        self.users[uid] = {"id": uid, "name": name, "sortable_name": f"{last}, {first}",
                           "login_id": login}

    def new_file(self, filename: str, data: bytes) -> dict:
        fid = next(self._ids)
        self.files[fid] = {"id": fid, "display_name": filename, "filename": filename,
                           "size": len(data), "content-type": "application/octet-stream",
                           "url": f"{self.url}/files/{fid}/download?download_frd=1&verifier=v{fid}",
                           "_data": data}
        return self.files[fid]

    def submit(self, aid: int, uid: int, files: dict = None, submitted_at: str = None,
               late: bool = False, attempt: int = 1) -> None:
        """The student's submission: ``files`` name -> bytes (None: unsubmitted)."""
        atts = [self.new_file(n, d) for n, d in (files or {}).items()]
        self.submissions[(aid, uid)] = {
            "id": next(self._ids), "assignment_id": aid, "user_id": uid,
            "attempt": attempt if files else None, "submitted_at": submitted_at if files else None,
            "late": late, "workflow_state": "submitted" if files else "unsubmitted",
            "submission_type": "online_upload" if files else None, "score": None, "grade": None,
            "entered_score": None, "attachments": atts, "submission_comments": []}

    def comments(self, aid: int, uid: int) -> list:
        return self.submissions[(aid, uid)]["submission_comments"]

    def file_data(self, fid: int) -> bytes:
        return self.files[fid]["_data"]

    # ---------------------------------------------------------------- answers
    def public_file(self, f: dict) -> dict:
        return {k: v for k, v in f.items() if not k.startswith("_")}

    def public_submission(self, s: dict, include) -> dict:
        out = {k: v for k, v in s.items() if k != "submission_comments"}
        out["attachments"] = [self.public_file(a) for a in s["attachments"]]
        if "user" in include:
            out["user"] = self.users[s["user_id"]]
        if "submission_comments" in include:
            out["submission_comments"] = [
                {**c, "attachments": [self.public_file(a) for a in c["attachments"]]}
                for c in s["submission_comments"]]
        return out


def _handler(state: StandIn):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):   # quiet
            pass

        def setup(self):   # answer at once: no Nagle delay between headers and body
            super().setup()
            import socket
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _send(self, code: int, body=None, headers=None, raw: bytes = None):
            data = raw if raw is not None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Rate-Limit-Remaining", "0.0" if code == 403 else "700.0")
            self.send_header("X-Request-Cost", "1.5")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _drop(self):
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def do_PUT(self):
            self._route("PUT")

        def _route(self, method: str):
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            body = self._body()
            with state._lock:
                state.log.append((method, parts.path))
                if state.down:
                    return self._drop()
                if parts.path.startswith(API) and "/create_success" not in parts.path:
                    auth = self.headers.get("Authorization", "")
                    if auth.removeprefix("Bearer ") in state.student_tokens:
                        return self._send(401, {"status": "unauthorized", "errors": [
                            {"message": "user not authorized to perform that action"}]})
                    if auth != f"Bearer {state.token}":
                        return self._send(401, {"errors": [{"message": "Invalid access token."}]},
                                          {"WWW-Authenticate": 'Bearer realm="canvas-lms"'})
                    if state.rate_limit > 0:
                        state.rate_limit -= 1
                        return self._send(403, raw=b"403 Forbidden (Rate Limit Exceeded)\n")
                return self._answer(method, parts.path, query, body)

        def _answer(self, method, path, query, body):
            not_found = (404, {"errors": [{"message": "The specified resource does not exist."}]})
            m = re.fullmatch(r"/files/(\d+)/download", path)
            if m and method == "GET" and int(m[1]) in state.files:
                state.downloads += 1
                if state.down_after_downloads is not None and state.downloads > state.down_after_downloads:
                    state.down = True
                    return self._drop()
                return self._send(200, raw=state.file_data(int(m[1])))
            m = re.fullmatch(r"/files_api/upload/(\d+)", path)
            if m and method == "POST":   # step 2: the file itself, then the redirect to confirm
                fid = int(m[1])
                msg = BytesParser(policy=HTTP).parsebytes(
                    f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode() + body)
                for part in msg.iter_parts():
                    if part.get_param("name", header="content-disposition") == "file":
                        state.files[fid]["_data"] = part.get_payload(decode=True)
                        state.files[fid]["size"] = len(state.files[fid]["_data"])
                return self._send(302, {}, {"Location": f"{state.url}{API}/files/{fid}/"
                                            f"create_success?uuid=u{fid}"})
            m = re.fullmatch(API + r"/files/(\d+)/create_success", path)
            if m and method == "GET":    # step 3: confirmed
                f = state.files.get(int(m[1]))
                if f is None or query.get("uuid") != [f"u{f['id']}"]:
                    return self._send(*not_found)
                f["_confirmed"] = True
                return self._send(200, state.public_file(f))
            m = re.fullmatch(API + r"/courses/(\d+)(?:/assignments/(\d+)(?:/submissions"
                                   r"(?:/(\d+)(/comments/files)?)?)?)?", path)
            if not m or int(m[1]) != state.course_id:
                return self._send(*not_found)
            if m[2] is None:
                return self._send(200, {"id": state.course_id, "name": "ML101",
                                        "course_code": "ML101"})
            aid = int(m[2])
            if aid not in state.assignments:
                return self._send(*not_found)
            if path.endswith(f"/assignments/{aid}"):
                return self._send(200, state.assignments[aid])
            include = query.get("include[]", [])
            if m[3] is None:   # the list, paginated
                subs = sorted((s for (a, _), s in state.submissions.items() if a == aid),
                              key=lambda s: s["user_id"])
                per = min(int(query.get("per_page", ["10"])[0]), state.page_size)
                page = int(query.get("page", ["1"])[0])
                chunk = subs[(page - 1) * per: page * per]
                links = []
                inc = "".join(f"&include[]={i}" for i in include)
                if page * per < len(subs):
                    links.append(f'<{state.url}{path}?page={page + 1}&per_page={per}{inc}>; rel="next"')
                links.append(f'<{state.url}{path}?page=1&per_page={per}{inc}>; rel="first"')
                return self._send(200, [state.public_submission(s, include) for s in chunk],
                                  {"Link": ", ".join(links)})
            sub = state.submissions.get((aid, int(m[3])))
            if sub is None:
                return self._send(*not_found)
            if m[4]:   # step 1 of a comment file's upload
                form = parse_qs(body.decode())
                f = state.new_file(form.get("name", ["file"])[0], b"")
                return self._send(200, {"upload_url": f"{state.url}/files_api/upload/{f['id']}",
                                        "upload_params": {"filename": f["filename"],
                                                          "content_type": "text/html"}})
            if method == "GET":
                return self._send(200, state.public_submission(sub, include))
            if method == "PUT":
                form = parse_qs(body.decode())
                state.puts += 1
                if "submission[posted_grade]" in form:
                    grade = form["submission[posted_grade]"][0]
                    sub["score"] = sub["entered_score"] = float(grade)
                    sub["grade"] = grade
                    sub["workflow_state"] = "graded"
                if "comment[text_comment]" in form or "comment[file_ids][]" in form:
                    files = [state.files[int(i)] for i in form.get("comment[file_ids][]", [])]
                    if not all(f.get("_confirmed") for f in files):
                        return self._send(400, {"errors": [{"message": "file not uploaded"}]})
                    sub["submission_comments"].append({
                        "id": next(state._ids), "author_id": 1, "author_name": "Teacher",
                        "comment": form.get("comment[text_comment]", [""])[0],
                        "created_at": "2026-10-09T10:00:00Z", "attachments": files})
                if state.down_after_puts is not None and state.puts > state.down_after_puts:
                    state.down = True     # applied, but the answer never arrives
                    return self._drop()
                if state.puts in state.lose_answers_of_puts:
                    return self._drop()   # applied, the answer lost; the network stays up
                return self._send(200, state.public_submission(sub, ["submission_comments"]))
            return self._send(*not_found)

    return Handler
