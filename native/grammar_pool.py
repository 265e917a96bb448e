"""Grammar compilation in child processes: a grammar that crashes the compiler, or takes too
long, costs a child, never the server.

xgrammar is C++: a schema nested thousands deep overflows its stack, some inputs end in a
fatal check (``abort``), and a small grammar can take minutes. None of that can be caught in
the process that runs it. So the native backend first compiles each new grammar in a child
(``python -m wick.native.grammar_worker``, which holds the model's vocabulary) and compiles it
itself only once the child has: what crashed or stalled a child never reaches the server.

- ``limits.workers`` children compile at once, one grammar each (small grammars of other
  requests do not wait behind a large one beyond that); a child is started on first use and
  after one was lost.
- A compile has ``limits.compile_timeout_s``: past it the child is killed and the request gets
  a 400. A child that crashes gives a 400 naming the signal and what xgrammar last printed.
- A request whose client leaves abandons its compile: the child is killed unless another
  request waits for the same grammar (requests for one grammar share one compile).
- A child's memory is bounded (``RLIMIT_AS``, 4x ``limits.cache_bytes``, at least 2 GiB), and
  it reports what the compiled grammar holds, which the backend's cache is bounded by.
- Grammars a child refused are remembered (the last ``REFUSED_REMEMBERED``): sending one
  again is answered at once, not with another child's time.

Frames between parent and child: a 4-byte big-endian length, then UTF-8 JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from ..engine.errors import InvalidRequestError, WickError
from ..engine.grammar import GrammarSpec, compile_error
from ..engine.grammar_limits import GrammarLimits

log = logging.getLogger("wick.grammar")
REFUSED_REMEMBERED = 256
_POLL_S = 0.05  # how often a waiting compile looks at its deadline and its requests
START_TIMEOUT_S = 120.0  # a child's start (xgrammar's import, the vocabulary), apart from budgets
_STDERR_TAIL = 4096


@dataclass(frozen=True, slots=True)
class WorkerVocab:
    """What a child needs to build xgrammar's tokenizer info (the backend's own)."""

    tokens: list[str]
    vocab_type: int
    vocab_size: int
    stop_token_ids: list[int]
    add_prefix_space: bool


@dataclass(frozen=True, slots=True)
class CompileReport:
    """A child compiled the grammar: in ``seconds``, holding ``bytes`` of memory."""

    seconds: float
    bytes: int


@dataclass(frozen=True, slots=True)
class _Refusal:
    """Why a grammar is refused (kept as data, not as an exception: a raised exception's
    traceback holds its callers' frames, and a stored one would keep them alive)."""

    message: str
    code: str | None
    closed: bool = False  # the pool was closed: not the grammar's fault

    def error(self, spec: GrammarSpec) -> WickError:
        if self.closed:
            return WickError(self.message, code=self.code)
        return InvalidRequestError(self.message, param=spec.param, code=self.code)


@dataclass(slots=True)
class PoolStats:
    started: int = 0  # children started
    compiled: int = 0
    refused: int = 0  # the compiler said the grammar is invalid
    crashed: int = 0
    timed_out: int = 0
    abandoned: int = 0  # every request waiting for it left


def write_frame(out: BinaryIO, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


def read_frame(inp: BinaryIO) -> dict[str, Any] | None:
    """The next frame, or None at the end of the stream."""
    head = inp.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    data = inp.read(size)
    return json.loads(data) if len(data) == size else None


class _Lost(Exception):
    """The child ended without answering (crashed, or killed by its memory bound)."""

    def __init__(self, returncode: int | None, stderr: str) -> None:
        super().__init__(returncode, stderr)
        self.returncode, self.stderr = returncode, stderr

    def how(self) -> str:
        """How it ended: "signal 11, SIGSEGV" or "exit code N"."""
        code = self.returncode
        if code is not None and code < 0 and -code in signal.Signals._value2member_map_:
            return f"signal {-code}, {signal.Signals(-code).name}"
        return f"exit code {code}"

    def last_said(self) -> str:
        """The last line it wrote to stderr ("" for none)."""
        said = [line for line in self.stderr.splitlines() if line.strip()]
        return said[-1].strip() if said else ""


class _Stopped(Exception):
    """The compile was stopped: ``reason`` is "timeout" or "abandoned"."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Child:
    """One compile child: started with the vocabulary, then asked one grammar at a time."""

    def __init__(self, init: dict[str, Any]) -> None:
        self._stderr = tempfile.TemporaryFile()
        # (the child's slot reads its stderr when it is lost while the pool's close kills it
        # from another thread: one of them at a time, and a closed file is left alone)
        self._stderr_lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wick.native.grammar_worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, close_fds=True)
        self._buffer = b""
        assert self.proc.stdin is not None
        write_frame(self.proc.stdin, init)

    def wait_ready(self, abandoned: threading.Event) -> None:
        """Until the child has read the vocabulary (importing xgrammar and building its
        tokenizer info took over 1 s on a busy machine: counted in the first compile's budget,
        it got an innocent grammar refused as too slow, and remembered)."""
        answer = self._read(time.monotonic() + START_TIMEOUT_S, abandoned)
        if not answer.get("ready"):
            raise self._lost()

    def compile(self, job: dict[str, Any], deadline: float, abandoned: threading.Event
                ) -> dict[str, Any]:
        """The child's answer to ``job``; raises ``_Stopped`` (the child is then killed) or
        ``_Lost``."""
        assert self.proc.stdin is not None
        try:
            write_frame(self.proc.stdin, job)
        except (BrokenPipeError, OSError):
            raise self._lost() from None
        return self._read(deadline, abandoned)

    def _read(self, deadline: float, abandoned: threading.Event) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            if abandoned.is_set():
                self.kill()
                raise _Stopped("abandoned")
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise _Stopped("timeout")
            ready, _, _ = select.select([fd], [], [], min(left, _POLL_S))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._lost()
            self._buffer += chunk
            if len(self._buffer) >= 4:
                (size,) = struct.unpack(">I", self._buffer[:4])
                if len(self._buffer) >= 4 + size:
                    data, self._buffer = self._buffer[4:4 + size], self._buffer[4 + size:]
                    return json.loads(data)

    def _lost(self) -> _Lost:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        with self._stderr_lock:
            tail = ""
            if not self._stderr.closed:
                self._stderr.seek(max(0, self._stderr.seek(0, 2) - _STDERR_TAIL))
                tail = self._stderr.read().decode(errors="replace")
                self._stderr.close()
        return _Lost(code, tail)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        with self._stderr_lock:
            self._stderr.close()


@dataclass(slots=True)
class _Job:
    spec: GrammarSpec
    future: Future = field(default_factory=Future)
    waiters: int = 1
    abandoned: threading.Event = field(default_factory=threading.Event)


class GrammarPool:
    """Compiles grammars in ``limits.workers`` child processes (see the module docstring).
    ``run(spec)`` blocks, ``run_async(spec)`` awaits; both return a ``CompileReport`` or raise
    the request's error."""

    def __init__(self, vocab: WorkerVocab, limits: GrammarLimits) -> None:
        self.limits = limits
        self.stats = PoolStats()
        self._init = {**asdict(vocab),
                      "memory_limit": max(2 << 30, 4 * limits.cache_bytes)}
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], _Job] = {}  # queued or compiling, by spec
        self._refused: OrderedDict[tuple[str, str], _Refusal] = OrderedDict()
        self._slots: list[threading.Thread] = []
        self._children: list[_Child] = []
        self._closed = False

    @property
    def pids(self) -> list[int]:
        """The compile children alive now."""
        with self._lock:
            return [c.proc.pid for c in self._children if c.proc.poll() is None]

    # -- asking ----------------------------------------------------------------------------

    def run(self, spec: GrammarSpec) -> CompileReport:
        job = self._submit(spec)
        try:
            result = job.future.result()
        except BaseException:
            self._leave(job)
            raise
        return self._outcome(spec, result)

    async def run_async(self, spec: GrammarSpec) -> CompileReport:
        job = self._submit(spec)
        try:
            # shielded: one waiter leaving must not cancel the compile the others share
            result = await asyncio.shield(asyncio.wrap_future(job.future))
        except asyncio.CancelledError:
            self._leave(job)
            raise
        return self._outcome(spec, result)

    @staticmethod
    def _outcome(spec: GrammarSpec, result: CompileReport | _Refusal) -> CompileReport:
        if isinstance(result, _Refusal):
            raise result.error(spec)
        return result

    def _submit(self, spec: GrammarSpec) -> _Job:
        key = (spec.kind, spec.source)
        with self._lock:
            if self._closed:
                raise WickError("the grammar compiler is closed", code="engine_closed")
            refused = self._refused.get(key)
            if refused is not None:
                raise refused.error(spec)
            job = self._running.get(key)
            if job is not None and not job.abandoned.is_set():
                job.waiters += 1
                return job
            job = self._running[key] = _Job(spec)
            if len(self._slots) < min(self.limits.workers, len(self._running)):
                thread = threading.Thread(target=self._slot, name="wick-grammar-child",
                                          daemon=True)
                self._slots.append(thread)
                thread.start()
        self._jobs.put(job)
        return job

    def _leave(self, job: _Job) -> None:
        """A waiter of ``job`` left; the last one abandons it."""
        with self._lock:
            job.waiters -= 1
            if job.waiters > 0 or job.future.done():
                return
            job.abandoned.set()
            if self._running.get((job.spec.kind, job.spec.source)) is job:
                del self._running[(job.spec.kind, job.spec.source)]

    # -- the children ----------------------------------------------------------------------

    def _slot(self) -> None:
        """One compile at a time, on one child (a new one after a child is lost)."""
        child: _Child | None = None
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                if job.abandoned.is_set():
                    continue
                if child is None:
                    child = self._ready_child(job)
                    if child is None:  # (the job is settled)
                        continue
                child = self._compile(child, job)
        finally:
            if child is not None:
                child.kill()

    def _ready_child(self, job: _Job) -> _Child | None:
        """A new child once it has read the vocabulary; None, with ``job`` settled, when it
        could not start or every request waiting for ``job`` left meanwhile."""
        try:
            child = self._start_child()
            child.wait_ready(job.abandoned)
            return child
        except _Stopped as stop:
            self._forget(child)
            if stop.reason == "abandoned":
                self.stats.abandoned += 1
                self._settle(job, None)
                return None
            why = f"it did not start within {START_TIMEOUT_S:g} s"
        except _Lost as lost:
            self._forget(child)
            last = lost.last_said()
            why = f"it ended with {lost.how()}" + (f": {last}" if last else "")
        except Exception as e:  # noqa: BLE001 - no child: this job's error, not a hang
            why = str(e)
        log.error("the grammar compiler could not start: %s", why)
        self._settle(job, _Refusal(f"The grammar compiler could not start ({why}).",
                                   "grammar_compiler_failed", closed=True))
        return None

    def _start_child(self) -> _Child:
        child = _Child(self._init)
        with self._lock:
            self.stats.started += 1
            self._children.append(child)
            if self._closed:  # closed while this one started
                child.kill()
        return child

    def _compile(self, child: _Child, job: _Job) -> _Child | None:
        """Run ``job`` on ``child``; settle its future; the child to keep (None: lost)."""
        spec = job.spec
        started = time.monotonic()
        result: CompileReport | _Refusal | None = None
        try:
            answer = child.compile({"kind": spec.kind, "source": spec.source,
                                    "param": spec.param},
                                   started + self.limits.compile_timeout_s, job.abandoned)
        except _Stopped as stop:
            self._forget(child)
            child = None
            if stop.reason == "abandoned":
                self.stats.abandoned += 1
                log.info("a grammar compile was abandoned: its requests left")
            else:
                self.stats.timed_out += 1
                result = self._too_slow(spec)
        except _Lost as lost:
            self._forget(child)
            child = None
            self.stats.crashed += 1
            result = self._crashed(spec, lost)
        else:
            if answer.get("ok"):
                self.stats.compiled += 1
                result = CompileReport(answer["seconds"], answer["bytes"])
            else:
                self.stats.refused += 1
                result = _Refusal(answer["message"], answer["code"])
        self._settle(job, result)
        return child

    def _settle(self, job: _Job, result: CompileReport | _Refusal | None) -> None:
        key = (job.spec.kind, job.spec.source)
        with self._lock:
            if self._running.get(key) is job:
                del self._running[key]
            if isinstance(result, _Refusal) and not result.closed:  # (the grammar's own)
                self._refused[key] = result
                while len(self._refused) > REFUSED_REMEMBERED:
                    self._refused.popitem(last=False)
        if job.future.done():  # the pool was closed meanwhile
            return
        if result is None:
            job.future.cancel()
        else:
            job.future.set_result(result)

    def _forget(self, child: _Child) -> None:
        with self._lock:
            if child in self._children:
                self._children.remove(child)

    def _too_slow(self, spec: GrammarSpec) -> _Refusal:
        seconds = self.limits.compile_timeout_s
        log.warning("a grammar compile took longer than %g s and was stopped (%s, %d bytes)",
                    seconds, spec.param, len(spec.source))
        return _Refusal(
            f"The grammar in '{spec.param}' took longer than {seconds:g} s to compile and was "
            "stopped; the bound is GrammarLimits.compile_timeout_s (`wick serve "
            "--grammar-timeout` raises it). Simplify it: fewer optional properties, less "
            "nesting, fewer nested repetitions.", "grammar_too_large")

    def _crashed(self, spec: GrammarSpec, lost: _Lost) -> _Refusal:
        how, last = lost.how(), lost.last_said()
        log.warning("the grammar compiler crashed on %s (%d bytes): %s%s", spec.param,
                    len(spec.source), how, f"; it said: {last}" if last else "")
        detail = f"the grammar compiler crashed on it ({how})"
        if "MemoryError" in lost.stderr or "bad_alloc" in lost.stderr:
            detail = "compiling it needs more memory than a compile may take"
        elif last:
            detail += f": {last}"
        err = compile_error(spec, detail)
        return _Refusal(f"{err.message.rstrip('.')}. It is probably too large or too deeply "
                        "nested.", err.code)

    def close(self) -> None:
        """Kill the children; waiting requests get an error."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            children, self._children = self._children, []
            jobs = list(self._running.values())
            self._running.clear()
        for job in jobs:
            job.abandoned.set()
            if not job.future.done():
                job.future.set_result(_Refusal("the engine was closed", "engine_closed",
                                               closed=True))
        for _ in self._slots:
            self._jobs.put(None)
        for child in children:
            child.kill()
