"""Export a drafter as the checkpoint directory SGLang / vLLM / the reference `dflash` load."""

from draftsmith.export.exporter import ExportResult, export_drafter, reference_check, resolve_drafter_dir

__all__ = ["ExportResult", "export_drafter", "reference_check", "resolve_drafter_dir"]
