"""The headers every HTTP reply carries, the 503 of a full broker's listener included."""

from __future__ import annotations

from typing import Final

__all__ = ["CSP", "SECURITY_HEADERS"]

# The web UI loads its scripts and styles from the broker and has an inline SVG favicon
# (a data: URL); nothing else is needed, so nothing else is allowed.
CSP: Final = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)

# Sent with every HTTP reply (docs/security.md, "Cross-site requests and the admin API"):
# no page of the broker in another site's frame, no reply's type guessed, and no reply
# pulled into another site's page as an image or a script.
SECURITY_HEADERS: Final = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
