"""wick.engine: the engine, in pure standard-library Python (it runs unchanged in Pyodide).

Build one from a runner (executes a ``Batch`` on a device), a tokenizer and the artifact's
``ModelInfo``::

    api = EngineAPI.from_runner(runner, tokenizer, info, num_pages=512)
    r = api.chat.completions.create(messages=[{"role": "user", "content": "Hi"}])
    print(r.choices[0].message.content)

``AsyncEngineAPI`` has the same API with ``await``; concurrent requests share steps.
"""

from .api import AsyncChunkStream, AsyncEngineAPI, ChunkStream, EngineAPI
from .batch import Batch, KVIndex, SamplingRow
from .chat_template import render_chat_template
from .core import EngineCore, EngineStats, RequestStats, SequenceOutput, StepRunner
from .detokenize import IncrementalDetokenizer, StopStringFilter
from .errors import (
    ArtifactError,
    ContextLengthExceededError,
    DeviceError,
    EngineAbortedError,
    InvalidRequestError,
    KVCacheFullError,
    MissingFeatureError,
    ModelNotFoundError,
    UnsupportedParameterError,
    WickError,
)
from .kv_cache import KVCache
from .model_info import ModelInfo
from .protocol import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceDelta,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionRequest,
    CompletionUsage,
    StreamOptions,
)
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence, SequenceStatus
from .tokenizer import Tokenizer

__all__ = [
    "ArtifactError", "AsyncChunkStream", "AsyncEngineAPI", "Batch", "ChatCompletion",
    "ChatCompletionChoice", "ChatCompletionChunk", "ChatCompletionRequest", "ChatMessage",
    "ChoiceDelta", "ChunkChoice", "ChunkStream", "Completion", "CompletionChoice",
    "CompletionRequest", "CompletionUsage", "ContextLengthExceededError", "DeviceError",
    "EngineAPI", "EngineAbortedError", "EngineCore", "EngineStats", "IncrementalDetokenizer",
    "InvalidRequestError", "KVCache", "KVCacheFullError", "KVIndex", "MissingFeatureError",
    "ModelInfo", "ModelNotFoundError", "RequestStats", "SamplingParams", "SamplingRow",
    "Scheduler", "Sequence", "SequenceOutput", "SequenceStatus", "StepRunner", "StopStringFilter",
    "StreamOptions", "Tokenizer", "UnsupportedParameterError", "WickError",
    "render_chat_template",
]
