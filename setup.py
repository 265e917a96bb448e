"""Everything declarative lives in pyproject.toml. This file only adds one build step: a wheel
(or a non-editable install) ships the browser engine -- the JS bundles in wick/server/static/web/
and the Pyodide assets in wick/server/static/wasm/ -- so that `wick serve` serves them with no
extra step. They are built by web/build.sh (node + npm) every time (without npm, the ones
already built in the tree are shipped). Editable installs read them from the source tree and
skip this step."""

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
STATIC = ROOT / "pyserver" / "static"
BUILT = (STATIC / "web" / "wick.js", STATIC / "web" / "wick-worker.js", STATIC / "wasm" / "manifest.json")


class BuildPyWithBrowserEngine(build_py):
    def run(self):
        if not getattr(self, "editable_mode", False):
            if shutil.which("npm") is not None:
                # always rebuilt: assets from an older tree would ship a stale engine copy
                subprocess.run(["bash", str(ROOT / "web" / "build.sh"), sys.executable], check=True)
            elif all(p.is_file() for p in BUILT):
                print("wick: npm not found; shipping the browser engine already built in "
                      "pyserver/static/ (web/build.sh)", file=sys.stderr)
            else:
                raise SystemExit(
                    "wick: building a wheel needs the browser engine (web/build.sh), which needs "
                    "node and npm: install them (apt-get install -y nodejs npm) or run "
                    "`bash web/build.sh` first")
        super().run()


CODE_PACKAGES = ["wick", "wick.compiler", "wick.compiler.models", "wick.compiler.targets",
                 "wick.engine", "wick.native", "wick.server"]


def static_packages() -> list[str]:
    """The directories of static assets, as setuptools wants every importable-looking data
    directory listed as a package (else it warns about each); those with other names (a
    Pyodide build id with dashes) ride along in package-data."""
    found = ["wick.server.static"]
    for d in sorted(p for p in STATIC.rglob("*") if p.is_dir()):
        parts = d.relative_to(STATIC).parts
        if all(part.isidentifier() for part in parts):
            found.append(".".join(("wick.server.static", *parts)))
    return found


setup(packages=CODE_PACKAGES + static_packages(), cmdclass={"build_py": BuildPyWithBrowserEngine})
