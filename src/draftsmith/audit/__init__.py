"""`draftsmith audit`: a data-quality gate for conversation and tokenized training sets.

    from draftsmith.audit import audit_tokenized
    report = audit_tokenized("data/tokenized", tokenizer="path/to/target")
    if not report.passed:
        raise SystemExit(report.verdict)
"""

from draftsmith.audit.conversations import audit_conversations
from draftsmith.data.sources import detect_kind
from draftsmith.audit.report import AuditReport, Check, Dominant, Gate
from draftsmith.audit.thresholds import Thresholds
from draftsmith.audit.tokenized import audit_tokenized

__all__ = [
    "AuditReport",
    "Check",
    "Dominant",
    "Gate",
    "Thresholds",
    "audit_conversations",
    "audit_tokenized",
    "detect_kind",
]
