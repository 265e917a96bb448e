"""A grammar compile child of ``grammar_pool`` (``python -m wick.native.grammar_worker``).

It reads the model's vocabulary, then grammars one at a time, and answers each with whether
xgrammar compiled it, how long that took and how much memory the compiled grammar holds. It
runs at a lower priority than the server and within a memory bound; whatever kills it (a
stack overflow, a fatal check, the bound) is its parent's to report.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import signal
import sys
import time

from ..engine.errors import InvalidRequestError
from ..engine.grammar import GrammarSpec
from .grammar import compile_spec, xgrammar_bindings
from .grammar_pool import read_frame, write_frame

NICENESS = 5
PR_SET_PDEATHSIG = 1


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_meter():
    """A function giving the bytes malloc has handed out (glibc's ``mallinfo2``, every arena;
    elsewhere the resident set): what a compiled grammar holds is the difference."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallinfo2 = libc.mallinfo2
        mallinfo2.restype = _MallInfo2

        def in_use() -> int:
            info = mallinfo2()
            return info.uordblks + info.hblkhd
        return in_use
    except (OSError, AttributeError):
        def resident() -> int:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return resident


def die_with_parent() -> None:
    """Linux: be killed when the server goes (even by SIGKILL), not compile on alone."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # elsewhere: stdin closes when the parent goes, after the compile at hand
    if os.getppid() == 1:  # the parent went before the line above ran
        sys.exit(0)


def main() -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # the frames are the only thing on stdout
    init = read_frame(inp)
    if init is None:
        return
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    die_with_parent()
    limit = int(init["memory_limit"])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    core = xgrammar_bindings()
    info = core.TokenizerInfo(init["tokens"], init["vocab_type"], init["vocab_size"],
                              init["stop_token_ids"], init["add_prefix_space"])
    compiler = core.GrammarCompiler(info, 2, False, -1)
    in_use = heap_meter()
    write_frame(out, {"ready": True})  # (a compile's time budget starts from here)
    while (job := read_frame(inp)) is not None:
        spec = GrammarSpec(job["kind"], job["source"], job["param"])
        before, started = in_use(), time.perf_counter()
        try:
            compiled = compile_spec(core, compiler, spec)
        except InvalidRequestError as e:
            write_frame(out, {"ok": False, "message": e.message, "code": e.code})
            continue
        except MemoryError:
            write_frame(out, {"ok": False, "code": "grammar_too_large", "message": (
                f"Compiling the grammar in '{spec.param}' needs more memory than a compile "
                "may take. Simplify it.")})
            continue
        seconds = time.perf_counter() - started
        size = max(0, in_use() - before)
        del compiled
        write_frame(out, {"ok": True, "seconds": seconds, "bytes": size})


if __name__ == "__main__":
    main()
