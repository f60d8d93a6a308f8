"""`draftsmith check`: catch every known cause of "good training metrics, poor served acceptance"."""

from draftsmith.core.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    "draftsmith.check",
    {
        "CheckConfig": "config",
        "CheckSummary": "config",
        "Finding": "config",
        "ParityResult": "config",
        "check_export": "runner",
        "logit_parity": "parity",
        "static_findings": "static",
        "template_sha256": "static",
    },
)
