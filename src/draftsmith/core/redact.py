"""Credentials out of anything a person or a file will see.

An endpoint given as ``http://user:key@host`` must keep working (the HTTP client sends the
credentials), but rows, failures files, summaries, logs and error messages carry the URL with its
password replaced by ``***``.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

# scheme://user:password@ or scheme://token@ inside any text (an error message quoting a URL).
_USERINFO_RE = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/\s:@]*)(?::(?P<password>[^/\s]*))?@")


def redact_url(url: str) -> str:
    """`url` with its password (or a lone token in the user part) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    if "@" not in parts.netloc:
        return url
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, has_password, _ = userinfo.partition(":")
    shown = f"{user}:{MASK}" if has_password else MASK
    return urlunsplit(parts._replace(netloc=f"{shown}@{host}"))


def redact(text: str) -> str:
    """Every URL credential in free text (log lines, error messages) masked."""

    def mask(match: re.Match) -> str:
        if match.group("password") is None:
            return f"{match.group('scheme')}{MASK}@"
        return f"{match.group('scheme')}{match.group('user')}:{MASK}@"

    return _USERINFO_RE.sub(mask, text)
