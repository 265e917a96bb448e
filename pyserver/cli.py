"""``wick``: the command line.

    wick compile MODEL [--quantization q4f16_1] [--output DIR] [--force] ...
    wick chat MODEL [--quantization Q] [--device auto|gpu|cpu|vulkan] [--temperature T] ...
    wick list                 compiled artifacts in the cache
    wick rm NAME_OR_PATH      delete one of them (only inside the artifacts directory)
    wick models               built-in model names

MODEL is a built-in name (``wick models``), a Hugging Face directory, a ``.gguf`` file or a
compiled artifact directory. Progress goes to stderr, results to stdout. Any failure ends the
command with one ``error: ...`` line and exit status 1 (``--debug`` adds the traceback); usage
errors exit with 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..compiler.quantization import QUANTIZATIONS as _SCHEMES
from ..compiler.targets import KERNEL_SETS
from ..engine.errors import InvalidRequestError, WickError
from ..engine.model_info import model_names
from ..native.devices import DEVICE_HELP, DEVICES
from ..native.devices import device as device_arg
from .arg_types import positive_int
from .progress_bars import ProgressBars, human_bytes

QUANTIZATIONS = tuple(_SCHEMES)
DEFAULT_QUANTIZATION = "q4f16_1"  # best; devices without shader-f16 (some browsers) use q4f32_1


class CLIError(WickError):
    """A command-line request that cannot be done (bad name, a path outside the cache, ...)."""

    default_status = 400
    default_type = "invalid_request_error"
    default_code = "cli_error"


# ---------------------------------------------------------------------------------------------
# Commands


def cmd_compile(args: argparse.Namespace) -> int:
    from ..compiler.extra import require_compiler

    require_compiler(args.model)
    from ..compiler.compile import compile_model
    from ..compiler.synthetic import compile_synthetic

    bars = ProgressBars()
    try:
        out = (compile_synthetic if args.synthetic else compile_model)(
            args.model, args.quantization, output=args.output,
            context_window=args.context_window, prefill_chunk_size=args.prefill_chunk_size,
            max_batch_size=args.max_batch_size, force=args.force, progress=bars,
            kernel_sets=args.kernel_sets,
        )
    finally:
        bars.close()
    print(out)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from ..engine.protocol import SamplingFields
    from .chat_cli import ChatSession, run_repl
    from .local import Engine, named_artifact
    from .serve import speculative_of

    model = named_artifact(args.model)  # (an artifact's directory name: its path)
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                "max_tokens": args.max_tokens, "seed": args.seed}
    sampling = {k: v for k, v in sampling.items() if v is not None}
    SamplingFields(**sampling)  # (a bad value is one error: line now, not after the load)
    bars = ProgressBars()
    try:
        engine = Engine(model, quantization=args.quantization, device=args.device,
                        progress=bars, batch_invariant=args.batch_invariant,
                        prefix_cache=args.prefix_cache, speculative=speculative_of(args))
    finally:
        bars.close()
    session = ChatSession(engine, sampling=sampling, system=args.system)
    if hasattr(sys.stdout, "reconfigure"):  # a model may emit text the terminal cannot encode
        sys.stdout.reconfigure(errors="replace")
    info = engine.core.info
    print(f"wick chat: {info.model_id} ({info.quantization}) on {engine.device_name}; "
          f"{session.defaults_text()}")
    if engine.software_notice:
        print(f"note: {engine.software_notice}", file=sys.stderr)
    if session.completion_mode:
        print("This is a base model (no chat template): completion mode. Each line extends one "
              "text that the model continues; /reset starts a new one.")
    print("Type /help for commands; /exit or Ctrl-D quits, Ctrl-C stops a reply.")
    sys.stdout.flush()
    return run_repl(session)


def cmd_embed(args: argparse.Namespace) -> int:
    from .local import Engine, named_artifact

    model = named_artifact(args.model)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise InvalidRequestError("no text to embed: pass texts as arguments or one per line "
                                  "on standard input", param="input")
    bars = ProgressBars()
    try:
        engine = Engine(model, quantization=args.quantization, device=args.device,
                        progress=bars)
    finally:
        bars.close()
    result = engine.embeddings.create(input=texts)
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    for text, item in zip(texts, result.data):
        values = " ".join(f"{v:.6f}" for v in item.embedding)
        print(f"{values}" if args.quiet else f"{text}\t{values}")
    return 0


@dataclass(frozen=True, slots=True)
class ArtifactEntry:
    path: Path
    model_id: str
    quantization: str
    size: int  # bytes on disk
    source: str = ""  # what it was compiled from: a built-in name, a path, hf://ORG/REPO@COMMIT
    compiler: dict | None = None  # the manifest's stamp of the compiler that built it


def this_compiler() -> dict | None:
    """The stamp this install's compiler writes into a manifest (compiler/source_digest.py);
    None in a runtime-only install, which has no compiler to compare."""
    from ..compiler.extra import missing_compiler_modules

    if missing_compiler_modules():
        return None
    from ..compiler.source_digest import compiler_stamp

    return compiler_stamp()


def is_stale(entry: ArtifactEntry, current: dict | None) -> bool | None:
    """Whether another compiler built ``entry``: naming its model again compiles anew, so
    only its path still loads it (None: unknown, without a compiler or a readable stamp)."""
    if current is None or not isinstance(entry.compiler, dict):
        return None
    return entry.compiler != current


def list_artifacts(root: Path | None = None) -> list[ArtifactEntry]:
    """Finished artifacts directly under the artifacts directory (temp dirs skipped)."""
    from ..compiler.artifact_writer import sweep_stale_builds
    from ..compiler.paths import artifacts_dir
    from ..engine.artifact import MANIFEST_NAME

    root = root or artifacts_dir()
    sweep_stale_builds(root)  # builds whose compile was killed
    entries = []
    for path in sorted(root.iterdir()):
        manifest = path / MANIFEST_NAME
        if not path.is_dir() or ".tmp-" in path.name or not manifest.is_file():
            continue
        try:
            head = json.loads(manifest.read_text())
            model_id, quant = str(head["model_id"]), str(head["quantization"])
            source = str((head.get("source") or {}).get("model") or "")
            compiler = head.get("compiler")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            model_id, quant, source, compiler = "(unreadable manifest)", "?", "", None
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        entries.append(ArtifactEntry(path, model_id, quant, size, source, compiler))
    return entries


def cmd_list(args: argparse.Namespace) -> int:
    from ..compiler.paths import artifacts_dir

    entries = list_artifacts()
    if not entries:
        print(f"no compiled artifacts in {artifacts_dir()}", file=sys.stderr)
        return 0
    current = this_compiler()
    stale = [is_stale(e, current) for e in entries]
    rows = [("MODEL", "QUANT", "SIZE", "SOURCE", "COMPILER", "PATH")]
    rows += [(e.model_id, e.quantization, human_bytes(e.size), e.source or "-",
              {True: "stale", False: "current", None: "-"}[old], str(e.path))
             for e, old in zip(entries, stale)]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  "
              f"{r[3]:<{widths[3]}}  {r[4]:<{widths[4]}}  {r[5]}")
    if any(stale):
        gone = [e for e, old in zip(entries, stale) if old]
        print(f"{len(gone)} stale artifact(s), {human_bytes(sum(e.size for e in gone))}: built by "
              "another version of wick's compiler, so naming their model compiles it anew (a "
              "path still loads one). `wick rm --stale` deletes them.", file=sys.stderr)
    return 0


def find_artifact(name_or_path: str) -> Path:
    """The artifact directory ``wick rm`` may delete: a path directly inside the artifacts
    directory, or a directory name / model id / ``model-quant`` naming exactly one artifact."""
    from ..compiler.paths import artifacts_dir
    from ..engine.artifact import MANIFEST_NAME

    root = artifacts_dir().resolve()
    given = Path(name_or_path).expanduser()
    if given.exists() or "/" in name_or_path or name_or_path.startswith("."):
        target = given.resolve()
        if target.parent != root:
            raise CLIError(f"refusing to remove {given}: wick rm only deletes artifacts directly "
                           f"inside {root}", param="name")
        if not (target / MANIFEST_NAME).is_file():
            raise CLIError(f"{given} is not a wick artifact (no {MANIFEST_NAME})", param="name")
        return target
    matches = [e.path for e in list_artifacts(root)
               if name_or_path in (e.path.name, *model_names(e.model_id, e.quantization))]
    if not matches:
        raise CLIError(f"no compiled artifact named '{name_or_path}' in {root}; `wick list` "
                       "shows them", param="name")
    if len(matches) > 1:
        names = ", ".join(p.name for p in matches)
        raise CLIError(f"'{name_or_path}' names {len(matches)} artifacts ({names}); give the "
                       "directory name or path of one", param="name")
    return matches[0]


def cmd_rm(args: argparse.Namespace) -> int:
    if args.stale == (args.name is not None):
        raise CLIError("name one artifact (see `wick list`) or give --stale, not both",
                       param="name")
    if args.stale:
        return remove_stale()
    target = find_artifact(args.name)
    shutil.rmtree(target)
    print(f"removed {target}")
    return 0


def remove_stale() -> int:
    """``wick rm --stale``: delete the cached artifacts another compiler built."""
    from ..compiler.extra import COMPILE_EXTRA
    from ..compiler.paths import artifacts_dir

    current = this_compiler()
    if current is None:
        raise CLIError("telling which artifacts are stale needs wick's compiler, and this "
                       f"install has none: pip install '{COMPILE_EXTRA}', or remove one "
                       "artifact by name", param="stale")
    stale = [e for e in list_artifacts() if is_stale(e, current)]
    if not stale:
        print(f"no stale artifacts in {artifacts_dir()}", file=sys.stderr)
        return 0
    for entry in stale:
        shutil.rmtree(entry.path)
        print(f"removed {entry.path}")
    print(f"freed {human_bytes(sum(e.size for e in stale))}", file=sys.stderr)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from ..compiler.paths import sources_dir
    from ..compiler.sources import builtin_models

    from ..engine.sampling_defaults import read_values

    rows = [("NAME", "FAMILY", "PARAMS", "KIND", "DEFAULT", "DOWNLOAD", "LICENSE", "SAMPLING")]
    for name, entry in sorted(builtin_models().items()):
        here = (sources_dir() / name / ("config.json" if "dir" in entry
                                        else Path(entry["file"]).name)).is_file()
        kind = "embed" if entry.get("task") == "embed" else "chat" if entry.get("chat") else "base"
        rows.append((name, entry.get("family", "?"), entry.get("params", "?"), kind,
                     entry.get("default_quantization", DEFAULT_QUANTIZATION),
                     "downloaded" if here else f"{entry.get('download_mb', '?')} MB",
                     entry.get("license", "?"),
                     # (an HF directory's generation_config.json, read at compile, may add more)
                     " ".join(f"{k}={v:g}" for k, v in read_values(entry.get("sampling")).items())
                     + " (model card)" if entry.get("sampling") else "-"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
    return 0


# --- wick serve ------------------------------------------------------------------------------


def add_serve_parser(sub) -> None:
    from .serve import add_serve_arguments, serve_main

    p = sub.add_parser("serve", help="OpenAI-compatible REST server, chat page and artifact host")
    add_serve_arguments(p)
    p.set_defaults(run=serve_main)


# ---------------------------------------------------------------------------------------------
# Parser and entry point


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    parser = argparse.ArgumentParser(
        prog="wick", description="wick: compile and run LLMs on WebGPU / native wgpu.")
    parser.add_argument("--version", action="version", version=f"wick {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback when a command fails")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    model_help = ("built-in name (wick models), hf://ORG/REPO[@REVISION][/FILE.gguf], Hugging "
                  "Face dir, .gguf file")

    p = sub.add_parser("compile", help="compile a model to an artifact directory",
                       description="Compile MODEL; prints the artifact directory.")
    p.add_argument("model", help=model_help)
    p.add_argument("--quantization", "-q", choices=QUANTIZATIONS,
                   help=f"weight/activation format (default: the model's, {DEFAULT_QUANTIZATION} "
                        "for most (wick models lists them); devices without shader-f16 need "
                        "q4f32_1)")
    p.add_argument("--output", "-o", type=Path, help="artifact directory (default: the cache)")
    p.add_argument("--context-window", type=positive_int,
                   help="max tokens per sequence (default: the model's)")
    p.add_argument("--prefill-chunk-size", type=positive_int, default=256,
                   help="max new tokens per step (default 256)")
    p.add_argument("--max-batch-size", type=positive_int, default=32,
                   help="max sequences per step (default 32)")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument("--kernel-sets", metavar="SETS",
                   help=f"build only these kernel sets, comma-separated, of {','.join(KERNEL_SETS)}"
                        " (default: all; e.g. webgpu,wasm for browsers alone, cpu for this "
                        "machine's CPU); a backend without its set refuses the artifact")
    p.add_argument("--synthetic", action="store_true",
                   help="MODEL is an HF config.json (or a directory holding one): compile its "
                        "shapes with weights generated on the device at load, for benchmarks "
                        "(a few MB whatever the size; what it writes is noise, mostly ids "
                        "beyond its 259-token byte vocabulary, which print nothing)")
    p.set_defaults(run=cmd_compile)

    p = sub.add_parser("chat", help="chat with a model in the terminal",
                       description="Interactive chat. Type /help inside for commands.")
    p.add_argument("model", help=model_help + " or compiled artifact dir")
    p.add_argument("--quantization", "-q", choices=QUANTIZATIONS,
                   help="default: the best the device supports")
    p.add_argument("--device", type=device_arg, default="auto", metavar="|".join(DEVICES),
                   help=DEVICE_HELP + "; cuda:N the N-th NVIDIA GPU")
    p.add_argument("--temperature", type=float, help="0 = greedy (default 1)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--max-tokens", type=positive_int, help="per reply (default: until EOS)")
    p.add_argument("--seed", type=int)
    p.add_argument("--system", help="system prompt")
    p.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
                   help="greedy output that never depends on what else runs (default on)")
    p.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="each turn reuses the KV of the conversation so far (default on)")
    from .serve import add_speculative_arguments

    add_speculative_arguments(p)
    p.set_defaults(run=cmd_chat)

    p = sub.add_parser("list", help="list compiled artifacts")
    p.set_defaults(run=cmd_list)

    p = sub.add_parser("rm", help="delete compiled artifacts",
                       description="Delete an artifact inside the artifacts directory, or "
                                   "every stale one (--stale).")
    p.add_argument("name", metavar="NAME_OR_PATH", nargs="?",
                   help="directory name, model id or path (see wick list)")
    p.add_argument("--stale", action="store_true",
                   help="delete every artifact another version of wick's compiler built "
                        "(`wick list` marks them): naming their model compiles it anew")
    p.set_defaults(run=cmd_rm)

    p = sub.add_parser("models", help="list built-in model names")
    p.set_defaults(run=cmd_models)

    p = sub.add_parser("embed", help="print the embedding vectors of texts",
                       description="Embed each TEXT (or each line of standard input) with an "
                                   "embedding model; prints one line per text: the text, a tab, "
                                   "the vector's values (--json: the OpenAI response).")
    p.add_argument("model", help=model_help + " or compiled artifact dir (an embedding model, "
                                              "e.g. all-minilm-l6-v2)")
    p.add_argument("text", nargs="*", help="texts to embed (default: lines of standard input)")
    p.add_argument("--quantization", "-q", choices=QUANTIZATIONS,
                   help="default: the best the device supports")
    p.add_argument("--device", type=device_arg, default="auto", metavar="|".join(DEVICES),
                   help=DEVICE_HELP)
    p.add_argument("--json", action="store_true", help="print the OpenAI-shaped JSON response")
    p.add_argument("--quiet", action="store_true", help="print the vectors only")
    p.set_defaults(run=cmd_embed)

    add_serve_parser(sub)
    from .extension_build import add_extension_parser

    add_extension_parser(sub)
    from .export import add_export_parser

    add_export_parser(sub)
    return parser


def _terminate_cleanly() -> None:
    """SIGTERM ends a command like Ctrl-C does: ``finally`` blocks run, so an interrupted
    compile removes its half-written build (``wick serve`` installs its own handler)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def main(argv: list[str] | None = None) -> int:
    from .serve import setup_logging

    args = build_parser().parse_args(argv)
    _terminate_cleanly()
    setup_logging("debug" if args.debug else "info")
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except WickError as err:
        if args.debug:
            traceback.print_exc()
        print(f"error: {err.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `wick list | head -1`
        sys.stderr.close()
        return 1
    except Exception as err:  # noqa: BLE001 - a bug or an environment problem: one line
        if args.debug:
            traceback.print_exc()
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"error: {type(err).__name__}{': ' + detail if detail else ''} (this is a wick "
              "bug or a problem with this machine; --debug shows the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
