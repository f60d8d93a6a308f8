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


def check_endpoint_url(url: str, what: str = "endpoint", api_key: str | None = None) -> str:
    """`url` if it is a usable http(s) endpoint, else an `InputError` line that never shows its password.

    An API key beside credentials in the URL is refused too: the client would have to choose which
    one to send (the HTTP library refuses both at once).
    """
    from draftsmith.core.errors import InputError

    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number in 0-65535
        host = parts.hostname
    except ValueError as error:
        raise InputError(f"{what} {shown}: not a valid URL ({redact(str(error))})") from None
    if parts.scheme not in ("http", "https"):
        raise InputError(f"{what} {shown}: not an http:// or https:// URL")
    if not host:
        raise InputError(f"{what} {shown}: no host in the URL")
    if port == 0:
        raise InputError(f"{what} {shown}: port 0 is not a server's port")
    if api_key and "@" in parts.netloc:
        raise InputError(
            f"{what} {shown}: the URL carries credentials and an API key is set too (--api-key or "
            "OPENAI_API_KEY); give only one of them"
        )
    return url
