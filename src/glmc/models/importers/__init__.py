"""Importers: stock architectures <-> the canonical model (one file per architecture)."""

from glmc.models.importers.base import IMPORTERS, Importer, NotRepresentable, importer_for
from glmc.models.importers.gpt2 import GPT2Importer
from glmc.models.importers.vit import ViTImporter

__all__ = ["IMPORTERS", "Importer", "NotRepresentable", "importer_for", "GPT2Importer",
           "ViTImporter"]
