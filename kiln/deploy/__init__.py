"""Deployment: `kiln.export` writes a compiled model as a directory that runs without kiln's
compiler, `kiln.load` runs it from Python (docs/deploy.md)."""

from kiln.deploy.export import ExportError, export
from kiln.deploy.load import ArtifactError, LoadedArtifact, load

__all__ = ["ArtifactError", "ExportError", "LoadedArtifact", "export", "load"]
