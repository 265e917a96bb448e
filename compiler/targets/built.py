"""A kernel set as the artifact stores it (what every target's ``build`` returns). No TVM here:
the artifact writer's checks read it in a runtime-only install."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass
class BuiltSet:
    """A kernel set as the artifact stores it: its files (path in the artifact -> bytes) and
    its manifest entry (``kernel_sets[kind]``: its form, and what its loader reads, files and
    hashes included; docs/artifact.md)."""

    files: dict[str, bytes]
    entry: dict


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def library(kind: str, form: str, path: str, data: bytes, entry: dict) -> dict[str, BuiltSet]:
    """A kernel set of one file: ``entry`` with the form first and the hash last."""
    return {kind: BuiltSet({path: data}, {"form": form, "file": path, **entry,
                                          "sha256": digest(data)})}
