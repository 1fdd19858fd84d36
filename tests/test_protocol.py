"""The grader's cross-process contracts (autograder.engine.protocol): each round-trips, defaults in one place,
and a job of another protocol version is refused where a Dask worker receives it."""
import dataclasses
import json

import pytest

from autograder.options import GradingOptions
from autograder.engine.protocol import (VERSION, Job, KernelReply, KernelRequest, ProtocolMismatch,
                                 RemoteJob, Report)


def test_a_job_round_trips_through_its_file(tmp_path):
    job = Job(input="in.ipynb", output="out.ipynb", report="r.json", job_dir=str(tmp_path),
              options=GradingOptions(cell_timeout=7), sandbox=False, data_files=["a.csv"])
    job.write(tmp_path / "job.json")
    back = Job.read(tmp_path / "job.json")
    assert back == job and back.options.cell_timeout == 7 and back.version == VERSION


def test_a_job_of_another_version_is_refused():
    data = Job(input="i", output="o", report="r", job_dir="j").to_dict()
    with pytest.raises(ProtocolMismatch):
        Job.from_dict({**data, "version": VERSION + 1})
    remote = RemoteJob(notebook="{}", files=[], options=GradingOptions().as_dict()).to_dict()
    assert RemoteJob.from_dict(remote).version == VERSION
    for bad in ({**remote, "version": VERSION + 1}, {k: v for k, v in remote.items() if k != "version"}):
        with pytest.raises(ProtocolMismatch):
            RemoteJob.from_dict(bad)


def test_a_report_has_one_set_of_defaults_and_keeps_worker_fields_only_when_set(tmp_path):
    assert Report().to_dict() == {"review": [], "timeouts": [], "kernel": "", "capped": [],
                                  "tampered": [], "retry": False, "notes": []}
    assert Report.read(tmp_path / "missing.json") == Report()
    rep = Report.from_dict({"kernel": "gone", "tampered": ["math.sqrt"], "extra": 1})
    assert rep.reasons() == ["gone (killed, or over a memory or process limit)",
                             "the notebook's code changed math.sqrt in its kernel (this is what the "
                             "kernel reported when asked after each test: it proves a change, not its "
                             "effect, and a change it missed is possible. The tests' own checks ran "
                             "outside the notebook, but an exercise rule's verdict, such as a library op "
                             "forbidden, is watched inside it: check the points those rules guard)"]
    rep.worker, rep.worker_deaths = "tcp://w", 0
    assert rep.to_dict()["worker_deaths"] == 0 and Report.from_dict(rep.to_dict()) == rep


def test_kernel_requests_and_replies():
    assert KernelRequest.lookup("x").to_json() == '{"op": "lookup", "name": "x"}'
    assert "watch" not in KernelRequest.call(0, [], {}, False).args
    reply = KernelReply.from_dict({"error": {"types": ["ValueError", "Exception"], "message": "m"}})
    exc = reply.raised()
    assert type(exc) is ValueError and str(exc) == "m"
    assert type(KernelReply.from_dict({"error": {"types": ["Evil"]}}).raised()) is RuntimeError
    assert KernelReply.from_dict({"value": None}).raised() is None
    assert KernelReply.from_dict({"module": "np"}).is_module


def test_every_option_is_a_flag_and_the_size_limit_is_no_setting_of_a_run():
    import argparse

    from autograder.intake.collect import DEFAULT_MAX_BYTES
    from autograder.options import add_arguments, from_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--max-size", "0.5", "--timeout", "7"])
    options = from_arguments(args)
    assert (options.max_size_mb, options.cell_timeout) == (0.5, 7)
    assert from_arguments(parser.parse_args([])) == GradingOptions()
    assert DEFAULT_MAX_BYTES == GradingOptions().max_size_mb * 2**20
    # grade's settings (what makes it re-run a graded notebook) are the options' repr: the size
    # limit is checked before a run, so it is left out of it
    assert "max_size" not in repr(options) and "cell_timeout=7" in repr(options)


def test_a_reply_counts_only_as_the_one_clean_reply_carrying_its_requests_nonce():
    """Issue 51, item 5: the kernel side echoes each request's fresh nonce; a request is answered
    only by its cell's one reply carrying it, in a cell that ended cleanly."""
    req = KernelRequest.lookup("x")
    assert "nonce" not in req.to_json()
    sent = json.loads(dataclasses.replace(req, nonce="ab12").to_json())
    assert sent == {"op": "lookup", "name": "x", "nonce": "ab12"}
    ok = {"value": 1, "nonce": "ab12"}
    reply, evidence = KernelReply.of_request([ok], "ab12", ended_cleanly=True)
    assert (reply.value, reply.nonce, evidence) == (1, "ab12", [])
    assert KernelReply.of_request([], "ab12", ended_cleanly=True) == (None, [])
    assert KernelReply.of_request([], "ab12", ended_cleanly=False) == (None, [])
    for replies, clean, why in (([{"value": 1}], True, "does not carry the request's nonce"),
                                ([{"value": 1, "nonce": "ff00"}], True, "does not carry the request's nonce"),
                                ([ok], False, "did not end cleanly"),
                                ([ok, ok], True, "2 replies to one request"),
                                ([{"value": 2, "nonce": "ab12"}, ok], True, "2 replies to one request"),
                                (["not a dict"], True, "does not carry the request's nonce")):
        reply, evidence = KernelReply.of_request(replies, "ab12", ended_cleanly=clean)
        assert reply is None and any(why in e for e in evidence), (replies, clean, evidence)


def test_the_kernel_side_echoes_the_nonce_it_was_sent():
    from autograder.engine.kernel.kernel_server import KernelServer
    sent = []
    server = KernelServer(namespace=lambda: {"x": 3}, publish=sent.append)
    server.kernel_request(dataclasses.replace(KernelRequest.lookup("x"), nonce="c0ffee").to_json())
    server.kernel_request(KernelRequest.lookup("x").to_json())
    server.kernel_request("not json")
    assert sent[0] == {"value": 3, "nonce": "c0ffee"} and "nonce" not in sent[1] and "error" in sent[2]


def test_a_function_that_exits_is_answered_with_its_error():
    """sys.exit() (or an exception class of the student's own outside Exception) in a function a
    test calls is the call's error, answered by the kernel side: it cannot end the request cell
    before the reply, and an honest exit is no tampering."""
    import sys

    from autograder.engine.kernel.kernel_server import KernelServer
    from autograder.engine.kernel.wire import encode

    def leaves():
        sys.exit(3)
    server = KernelServer(namespace=lambda: {"leaves": leaves}, publish=print)
    assert "value" in server.lookup("leaves") and server.refs == [leaves]
    reply = KernelReply.from_dict(server.call({"ref": 0, "args": encode(()), "kwargs": encode({})}))
    assert reply.error["types"][:2] == ["SystemExit", "BaseException"]
    exc = reply.raised()
    assert type(exc) is RuntimeError and str(exc) == "SystemExit: 3"


def test_a_large_request_reaches_the_kernel_as_a_file(tmp_path, monkeypatch):
    """A request above BIG_REQUEST (a call on a long sequence's tensors) is written to the folder the
    harness shares with the kernel and the request cell names the file: a kernel takes about 1.3 s
    to read a cell of 8 MB of text. The file is gone once the request is answered; a small request
    still travels in the cell."""
    import sys
    import types

    from autograder.engine import calls
    from autograder.engine.kernel.kernel_server import KernelServer
    server = KernelServer(namespace=lambda: {"big": "x" * (2 * calls.BIG_REQUEST), "small": 2})
    cells = []

    class Client:   # runs the request cell here, as the kernel would
        def run_request(self, code, timeout):
            cells.append(code)
            replies = []
            server.publish = replies.append
            exec(code, {})
            return replies, False, ""
    module = types.ModuleType("fake_kernel_side")
    module.kernel_request, module.kernel_request_file = server.kernel_request, server.kernel_request_file
    monkeypatch.setitem(sys.modules, module.__name__, module)
    link = calls.KernelLink(Client())
    link.module, link.measure_dir = module.__name__, (tmp_path, str(tmp_path))
    server.refs.append(lambda s: s.upper())
    from autograder.engine.kernel.wire import decode, encode
    long_arg = KernelRequest.call(0, encode(("y" * (2 * calls.BIG_REQUEST),)), encode({}), False)
    reply = link.request(long_arg, "the call")
    assert len(cells[-1]) < 500 and "kernel_request_file" in cells[-1]
    assert reply.error is None and decode(reply.value) == "Y" * (2 * calls.BIG_REQUEST)
    assert list(tmp_path.iterdir()) == [], "the request's file is removed once answered"
    link.request(KernelRequest.lookup("small"), "a lookup")
    assert "kernel_request(" in cells[-1] and "kernel_request_file" not in cells[-1]
