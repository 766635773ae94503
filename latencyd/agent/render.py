"""The cluster's LatencyProfiles as files the daemon reads, and back: each object's
`spec.profile` is written as NAME.toml, the set has one digest (what the node's
annotation shows, and what tells a relist or a restarted agent that nothing changed),
and an error the loader gives for one of those files is said in the cluster's terms
(`LatencyProfile tuning/rt: line 7: ...`). Pure."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".toml"
# A profile's name is a file name the daemon will look up: Kubernetes object names are
# DNS subdomains (lower-case alphanumerics, '-' and '.'), a subset of what latencyd takes.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class RenderError(ValueError):
    """A LatencyProfile that cannot become a file, and why."""


@dataclass(frozen=True)
class ProfileSet:
    """The LatencyProfiles of the agent's namespace, by name: their TOML text, and where
    each came from (namespace/name)."""

    texts: Mapping[str, str]
    sources: Mapping[str, str]

    @property
    def digest(self) -> str:
        """sha256 over every profile's name and text, in name order."""
        h = hashlib.sha256()
        for name in sorted(self.texts):
            for part in (name, self.texts[name]):
                data = part.encode()
                h.update(len(data).to_bytes(8, "big") + data)
        return h.hexdigest()

    def files(self) -> dict[str, bytes]:
        return {f"{name}{SUFFIX}": text.encode() for name, text in sorted(self.texts.items())}


def profile_set(objects: Iterable[Mapping[str, object]]) -> ProfileSet:
    texts: dict[str, str] = {}
    sources: dict[str, str] = {}
    for obj in objects:
        meta = obj.get("metadata")
        spec = obj.get("spec")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        namespace = meta.get("namespace", "") if isinstance(meta, Mapping) else ""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise RenderError(f"LatencyProfile {name!r}: not a name latencyd can look up")
        text = spec.get("profile") if isinstance(spec, Mapping) else None
        if not isinstance(text, str):
            raise RenderError(f"LatencyProfile {namespace}/{name}: spec.profile must be text")
        texts[name] = text
        sources[name] = f"{namespace}/{name}"
    return ProfileSet(texts, sources)


def in_cluster_terms(message: str, directory: Path, profiles: ProfileSet) -> str:
    """`message` with every `DIR/NAME.toml:LINE` of a rendered file said as the
    LatencyProfile it came from and the line of its spec.profile."""

    def said(match: re.Match[str]) -> str:
        name, line = match.group(1), match.group(2)
        source = profiles.sources.get(name)
        if source is None:
            return match.group(0)
        return f"LatencyProfile {source}" + (f": line {line}" if line else "")

    pattern = re.escape(str(directory)) + r"/([^/:\s]+)" + re.escape(SUFFIX) + r"(?::(\d+))?"
    return re.sub(pattern, said, message)
