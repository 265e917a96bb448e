"""Test doubles for the engine: a byte-level tokenizer and a runner that reads its own paged KV.

``FakeRunner`` keeps a token per KV slot: it writes each new token at ``append_slots`` and reads
each sampled sequence's context back through ``page_values``/``page_indptr``/``last_page_len``,
exactly as the attention kernel would. Its next token depends only on that context and the
row's sampling fields, so a wrong index array, a page reused too early or a broken recompute
changes the output.
"""

from __future__ import annotations

import array
import math
import re
import zlib
from collections.abc import Sequence

from wick.engine import Batch, ModelInfo, SamplingRow
from wick.engine.batch import SampledToken

BOS, EOS, IM_START, IM_END = 256, 257, 258, 259
SPECIALS = {"<s>": BOS, "</s>": EOS, "<|im_start|>": IM_START, "<|im_end|>": IM_END}
SPECIAL_TEXT = {v: k for k, v in SPECIALS.items()}
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")

# What the fake model "says": ASCII, a 2-byte char, a 3-byte char, and "." (EOS may follow it).
UNITS = ["a", "b", "c", "d", "e", "f", "g", " ", "é", "€", "."]

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ByteTokenizer:
    """Token i < 256 is byte i; 256..259 are special tokens. Multi-byte UTF-8 spans tokens."""

    vocab_size = 260

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in _SPECIAL_RE.split(text):
            if part in SPECIALS:
                ids.append(SPECIALS[part])
            else:
                ids.extend(part.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            if not skip_special_tokens:
                out.append(SPECIAL_TEXT[i])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


def make_info(**overrides) -> ModelInfo:
    fields = dict(
        model_id="fake-model", quantization="q0f32", family="fake", vocab_size=260,
        context_window=1024, page_size=4, prefill_chunk_size=32, max_batch_size=8,
        bos_token_id=BOS, eos_token_ids=(IM_END, EOS), add_bos_token=True,
        chat_template=SMOLLM2_TEMPLATE,
    )
    fields.update(overrides)
    return ModelInfo(**fields)


def _pending_utf8(context: Sequence[int]) -> bytes:
    """The bytes of an unfinished multi-byte character at the end of the context."""
    tail = bytearray()
    for t in reversed(context[-3:]):
        if t >= 256:
            break
        tail.insert(0, t)
        if t & 0xC0 != 0x80:  # a lead byte (or ASCII): the character starts here
            break
    if not tail or tail[0] < 0xC0:
        return b""
    need = 2 if tail[0] < 0xE0 else 3
    return bytes(tail) if len(tail) < need else b""


def fake_next_token(context: Sequence[int], row: SamplingRow, eos_id: int | None) -> int:
    if row.mask is not None:  # a grammar: the best-scoring allowed id
        words = array.array("i")
        words.frombytes(row.mask)
        allowed = [i for i in range(32 * len(words)) if words[i // 32] >> (i % 32) & 1]
        assert allowed, "a grammar mask that allows nothing"
        key = array.array("H", context).tobytes()
        return max(allowed, key=lambda i: (zlib.crc32(key + i.to_bytes(2, "little")), -i))
    pending = _pending_utf8(context)
    if pending:  # finish the character the model started
        for unit in UNITS:
            b = unit.encode()
            if b.startswith(pending):
                return b[len(pending)]
        raise AssertionError(f"no unit continues {pending!r}")
    if eos_id is not None and context and context[-1] == ord("."):
        return eos_id
    key = array.array("H", context).tobytes()
    logits = [((zlib.crc32(key + bytes([i])) % 1000) / 250.0) for i in range(len(UNITS))]
    if row.temperature == 0:
        choice = max(range(len(UNITS)), key=lambda i: (logits[i], -i))
    else:
        m = max(logits)
        probs = [math.exp((x - m) / row.temperature) for x in logits]
        order = sorted(range(len(UNITS)), key=lambda i: (-probs[i], i))
        if row.top_k:
            order = order[:row.top_k]
        total = sum(probs[i] for i in order)
        kept, acc = [], 0.0
        for i in order:  # nucleus: the smallest prefix reaching top_p
            kept.append(i)
            acc += probs[i] / total
            if acc >= row.top_p:
                break
        total = sum(probs[i] for i in kept)
        u, acc, choice = row.uniform * total, 0.0, kept[-1]
        for i in kept:
            acc += probs[i]
            if u < acc:
                choice = i
                break
    return UNITS[choice].encode()[0]


class FakeRunner:
    """``window``: the fake model sees only the last ``window`` tokens (a sliding-window model,
    ``ModelInfo.kv_window``). ``num_window_pages``/``local_window``: a model with a second,
    windowed pool (``kv_window_pool``): the runner keeps its slots too and checks that the
    window it lists holds the same tokens as the main pool's tail. Once ``kv`` is set (the
    core's cache), every write is checked: only into a page one sequence holds and the prefix
    cache does not."""

    def __init__(self, num_pages: int, page_size: int, *, eos_id: int | None = None,
                 window: int | None = None, num_window_pages: int = 0,
                 local_window: int | None = None) -> None:
        self.page_size = page_size
        self.slots: list[int | None] = [None] * (num_pages * page_size)
        self.eos_id = eos_id
        self.window = window
        self.num_window_pages = num_window_pages
        self.local_window = local_window
        self.local_slots: list[int | None] = [None] * (num_window_pages * page_size)
        self.batches: list[Batch] = []
        self.kv = None

    @property
    def max_batch_seen(self) -> int:
        return max((len(b.seq_ids) for b in self.batches), default=0)

    def _write(self, slots: list, pool, token_ids, append_slots) -> None:
        for token, slot in zip(token_ids, append_slots):
            page = slot // self.page_size
            if pool is not None:
                assert pool.refcount(page) == 1, f"a write into page {page}, held by " \
                    f"{pool.refcount(page)} sequences"
                assert not pool.is_cached(page), f"a write into cached page {page}"
            slots[slot] = token

    def _context(self, slots: list, kv, row: int, window: int | None) -> list[int]:
        """The tokens the last query row of ``row`` sees, read through the index arrays."""
        ps = self.page_size
        pages = kv.page_values[kv.page_indptr[row]:kv.page_indptr[row + 1]]
        first = kv.k_rope_pos_offset[row]  # absolute position of the first listed key
        kv_len = first + (len(pages) - 1) * ps + kv.last_page_len[row]
        # The causal rule: the last query row sees every column < kv_len.
        assert kv.q_positions[kv.qo_indptr[row + 1] - 1] == kv_len - 1
        lo = 0 if window is None else max(0, kv_len - window)
        assert lo >= first, f"the window starts at {lo}, the listed keys at {first}"
        context = [slots[pages[(j - first) // ps] * ps + j % ps] for j in range(lo, kv_len)]
        assert None not in context
        return context

    def step(self, batch: Batch) -> list[int]:
        self.batches.append(batch)
        kv = batch.kv
        b = len(batch.seq_ids)
        assert len(kv.qo_indptr) == b + 1 and kv.qo_indptr[-1] == len(batch.token_ids)
        assert len(kv.page_indptr) == b + 1 and kv.page_indptr[-1] == len(kv.page_values)
        assert len(kv.q_positions) == len(kv.append_slots) == len(batch.token_ids)
        assert len(batch.sampling) == len(batch.sample_rows)
        pools = (getattr(self.kv, "main", self.kv), getattr(self.kv, "local", None))
        self._write(self.slots, pools[0], batch.token_ids, kv.append_slots)
        if kv.window is not None:
            self._write(self.local_slots, pools[1], batch.token_ids, kv.window.append_slots)
        out = []
        for row, sampling in zip(batch.sample_rows, batch.sampling):
            context = self._context(self.slots, kv, row, self.window)
            if kv.window is not None:
                local = self._context(self.local_slots, kv.window, row, self.local_window)
                assert local == context[len(context) - len(local):], "the windowed pool " \
                    "holds other tokens than the main pool"
            token = fake_next_token(context, sampling, self.eos_id)
            if sampling.num_top_logprobs >= 0:  # a made-up logprob, a function of the context
                lp = -((zlib.crc32(array.array("H", context + [token]).tobytes()) % 997) / 100)
                token = SampledToken(token, lp, ((token, lp),) * sampling.num_top_logprobs)
            out.append(token)
        return out


class AsyncFakeRunner(FakeRunner):
    """The same, with the awaitable entry point a browser runner has."""

    steps_async = True  # (as a WebGPU runner in the browser: its steps are awaited)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.async_calls = 0

    async def step_async(self, batch: Batch) -> list[int]:
        import asyncio

        self.async_calls += 1
        await asyncio.sleep(0)
        return self.step(batch)


class LiteralGrammar:
    """A fake grammar backend for ``root ::= "<text>"``: the matcher allows the next byte of
    the text, then only ``eos_id``. ``asynchronous=True`` gives it the wasm build's shape
    (``compile_async`` only, ``next_token_bitmask_async``)."""

    def __init__(self, vocab_size: int, eos_id: int, asynchronous: bool = False) -> None:
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self.compiled: list[str] = []
        if asynchronous:
            self.compile_async = self._compile_async
        else:
            self.compile = self._compile

    def _compile(self, spec):
        from wick.engine.grammar import compile_error

        prefix = 'root ::= "'
        if spec.kind != "ebnf" or not spec.source.startswith(prefix) or \
                not spec.source.endswith('"'):
            raise compile_error(spec, f"[12:00:00] fake.cc:1: cannot parse {spec.source!r}")
        self.compiled.append(spec.source)
        return _LiteralCompiled(self, spec.source[len(prefix):-1].encode(),
                                hasattr(self, "compile_async"))

    async def _compile_async(self, spec):
        import asyncio

        await asyncio.sleep(0)
        return self._compile(spec)


class _LiteralCompiled:
    def __init__(self, backend, text: bytes, asynchronous: bool) -> None:
        self.backend, self.text, self.asynchronous = backend, text, asynchronous

    def matcher(self):
        return _LiteralMatcherAsync(self) if self.asynchronous else _LiteralMatcher(self)


class _LiteralMatcher:
    def __init__(self, compiled) -> None:
        self.c, self.pos, self.done = compiled, 0, False
        self.history: list[tuple[int, bool]] = []

    def rollback(self, num_tokens: int) -> None:
        assert 0 <= num_tokens <= len(self.history)
        if num_tokens:
            self.pos, self.done = self.history[-num_tokens]
            del self.history[-num_tokens:]

    def next_token_bitmask(self) -> bytes:
        words = array.array("i", [0] * ((self.c.backend.vocab_size + 31) // 32))
        t = self.c.text[self.pos] if self.pos < len(self.c.text) else self.c.backend.eos_id
        words[t // 32] |= 1 << (t % 32)
        return words.tobytes()

    def accept(self, token: int) -> bool:
        before = (self.pos, self.done)
        if self.pos < len(self.c.text) and token == self.c.text[self.pos]:
            self.pos += 1
        elif self.pos == len(self.c.text) and token == self.c.backend.eos_id:
            self.done = True
        else:
            return False
        self.history.append(before)
        return True

    def is_terminated(self) -> bool:
        return self.done


class _LiteralMatcherAsync(_LiteralMatcher):
    next_token_bitmask = None  # only the awaitable form, as the wasm build

    async def next_token_bitmask_async(self) -> bytes:
        import asyncio

        await asyncio.sleep(0)
        return _LiteralMatcher.next_token_bitmask(self)
