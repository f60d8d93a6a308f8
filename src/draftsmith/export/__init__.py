"""Export a drafter as the checkpoint directory SGLang / vLLM / the reference `dflash` load."""

from draftsmith.core.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    "draftsmith.export",
    {
        "ExportResult": "exporter",
        "export_drafter": "exporter",
        "reference_check": "exporter",
        "resolve_drafter_dir": "exporter",
    },
)
