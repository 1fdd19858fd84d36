"""A measured call, on the kernel's side (autograder.engine.calls.KernelLink.measured_call).

Sent into the student's kernel with the codec and the kernel server (their sources share one
namespace there); imported as ``autograder.engine.kernel.measure`` on the trusted side, where
:func:`checksum` gives the number a measured call's result must have.
"""
import sys

if __package__:   # on the trusted side; in the kernel the codec's source runs ahead of this one
    from .wire import WireError, decode, encode

__all__ = ["measure", "checksum"]


def checksum(tensor, seed: int) -> float:
    """The elements of ``tensor`` summed in float64 with weights in [0, 1) drawn from ``seed``:
    one number that two results share only when their elements are equal (to rounding)."""
    import torch
    flat = torch.Tensor.detach(tensor).reshape(-1).to(torch.float64)
    weights = torch.rand(flat.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return float((flat * weights).sum())


def measure(server, req):
    """Call the referenced callable on tensors read from files the harness wrote (so that the
    call's CPU time, which the harness reads from the operating system, is the function's
    work and not the text of its arguments), and reply with one number: the sum of the
    result's elements weighted by ``checksum_weights(seed, n)``. The harness compares it with
    the same sum over an ordinary call's result (autograder.engine.calls.KernelLink.measured_call)."""
    torch = sys.modules.get("torch") or __import__("torch")
    ref = req.get("ref")
    if type(ref) is not int or not 0 <= ref < len(server.refs):
        return {"error": {"types": ["LookupError"], "type": "LookupError",
                          "message": "the function is no longer available in the kernel"}}
    try:
        args = []
        for item in req["items"]:
            if "file" in item:
                shape = [int(n) for n in item["shape"]]
                numel = 1
                for n in shape:
                    numel *= n
                args.append(torch.from_file(str(item["file"]), size=numel,
                                            dtype=getattr(torch, str(item["dtype"]))).reshape(shape))
            else:
                args.append(decode(item["node"], modules=True))
        kwargs = decode(req["kwargs"], modules=True)
    except (WireError, KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        return server.error(exc)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # idle worker threads spin: their time would not be the function's work
    try:
        with torch.no_grad():
            result = server.refs[ref](*args, **dict(kwargs))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return server.error(exc)
    finally:
        torch.set_num_threads(threads)
    if not isinstance(result, torch.Tensor):
        return {"value": encode(None)}
    return {"value": encode(checksum(result, int(req.get("seed", 0))))}
