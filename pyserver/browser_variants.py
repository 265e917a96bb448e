"""Browser variants: the f32 twin of each served f16 model, so every browser can run it.

Many WebGPU adapters lack ``shader-f16`` (SwiftShader, several mobile and older GPUs, some
browsers). When ``wick serve`` serves an f16 variant (``q4f16_1``, ``q0f16``), it compiles the
same model with float32 activations (``q4f32_1``, ``q0f32``: same source, same compile options)
in a background thread once the model is loaded, announces it in ``/web/models.json`` under
``preparing`` with its progress meanwhile, and hosts it when done. A cached twin is found at
once. Progress goes to stderr like any compile.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from .artifact_host import ArtifactHost

log = logging.getLogger("wick.server")


class BrowserVariants:
    def __init__(self, host: ArtifactHost) -> None:
        self.host = host
        self._lock = threading.Lock()  # one compile at a time: each uses every core
        self.threads: list[threading.Thread] = []

    def add_for(self, artifact_dir: Path) -> threading.Thread | None:
        """Start building the twin of the served artifact ``artifact_dir`` when it needs one;
        returns the thread building it (None: no twin needed)."""
        from ..compiler.quantization import f32_twin
        from ..compiler.targets import BROWSER_KERNEL_SETS
        from ..engine.artifact import MANIFEST_NAME

        manifest = json.loads((Path(artifact_dir) / MANIFEST_NAME).read_text())
        twin = f32_twin(manifest["quantization"])
        if twin is None:
            return None
        model = manifest["model_id"]
        source = (manifest.get("source") or {}).get("model")
        options = dict(manifest.get("compile_options") or {})
        if options.get("kernel_sets"):  # (compiled with a choice: the twin is for browsers)
            options["kernel_sets"] = list(BROWSER_KERNEL_SETS)
        self.host.set_preparing(model, twin, stage="waiting", done=0, total=1)
        thread = threading.Thread(target=self._build, args=(model, twin, source, options),
                                  name=f"wick-variant-{twin}", daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def _build(self, model: str, quant: str, source: str | None, options: dict) -> None:
        from ..compiler.hub import is_hub_uri
        from ..compiler.extra import require_compiler
        from ..compiler.sources import builtin_models
        from .progress_bars import ProgressBars

        if not source or not (source in builtin_models() or is_hub_uri(source)
                              or Path(source).exists()):
            reason = (f"its source ({source}) is not on this machine" if source
                      else "its manifest names no source")
            log.warning("browsers without shader-f16 cannot run %s: its %s variant cannot be "
                        "built (%s)", model, quant, reason)
            self.host.set_preparing(model, quant, error=f"the {quant} variant cannot be built: "
                                    f"{reason}")
            return
        bars = ProgressBars(prefix=f"{model} {quant} (for browsers without shader-f16)")

        def progress(stage: str, done: int, total: int) -> None:
            self.host.set_preparing(model, quant, stage=stage, done=done, total=total)
            bars(stage, done, total)

        try:
            require_compiler(f"the {quant} variant of {model} (for browsers without shader-f16)")
            from ..compiler.compile import compile_model

            with self._lock:
                if options.pop("synthetic", False):  # (wick compile --synthetic CONFIG)
                    from ..compiler.synthetic import compile_synthetic

                    out = compile_synthetic(source, quant, progress=progress, **options)
                else:
                    out = compile_model(source, quant, progress=progress, **options)
        except Exception as err:  # noqa: BLE001 - reported to the log and to browsers
            message = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
            log.error("building the %s variant of %s for browsers failed: %s", quant, model,
                      message)
            self.host.set_preparing(model, quant, error=message)
            return
        finally:
            bars.close()
        self.host.add(out)
        self.host.done_preparing(model, quant)
        log.info("browsers without shader-f16 can now run %s (%s)", model, quant)
