"""What an application may attach to its message (`attachments` in the message API).

Every rule about an attachment's name, type, content id and content lives here; the serializer
(delivery/api/serializers.py) applies them, mime.render and the SendGrid payload trust them.

- A filename is 1 to MAX_FILENAME_LENGTH characters with no path separator (`/`, `\\`) and no
  control character: a receiving client saves it under that name, so `../../x` or a name that
  ends a header line must never get there. Non-ASCII is fine: mime.render encodes it per
  RFC 2231.
- An executable type mailbox providers reject is refused here rather than bounced later (the
  whole message would be lost, not the attachment): Gmail's list, "File types blocked in Gmail"
  (https://support.google.com/mail/answer/6590), matched case-insensitively on the last
  extension, ignoring trailing dots and spaces (Windows drops them: `a.exe.` opens as `a.exe`).
- A content type is RFC 6838's `type/subtype` of restricted names, never multipart/* or
  message/*: those are containers RFC 2046 forbids to encode in base64 (§5.1.1, §5.2.1).
- A content id (an inline image referenced as `cid:<id>` in the HTML) is a short token, unique
  within its message (RFC 2392: a Content-ID names one body part).
"""

from __future__ import annotations

import re

MAX_FILENAME_LENGTH = 255  # what common filesystems store (ext4, NTFS, APFS)
# The schema's patterns (JSON Schema, ECMA-262 syntax) and the checks' own.
FILENAME_PATTERN = r"^[^/\\\x00-\x1f\x7f-\x9f]+$"
CONTENT_TYPE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}$"
CONTENT_ID_PATTERN = r"^[A-Za-z0-9._@+-]{1,128}$"

BLOCKED_EXTENSIONS = frozenset(
    {
        "ade", "adp", "apk", "appx", "appxbundle", "bat", "cab", "chm", "cmd", "com", "cpl",
        "diagcab", "diagcfg", "diagpack", "dll", "dmg", "ex", "ex_", "exe", "hta", "img", "ins",
        "iso", "isp", "jar", "jnlp", "js", "jse", "lib", "lnk", "mde", "msc", "msi", "msix",
        "msixbundle", "msp", "mst", "nsh", "pif", "ps1", "scr", "sct", "shb", "sys", "vb", "vbe",
        "vbs", "vhd", "vxd", "wsc", "wsf", "wsh", "xll",
    }
)  # fmt: skip
CONTAINER_TYPES = ("multipart/", "message/")

_FILENAME = re.compile(FILENAME_PATTERN)
_CONTENT_TYPE = re.compile(CONTENT_TYPE_PATTERN)


def filename_problem(name: str) -> str | None:
    """Why `name` cannot be an attachment's filename, or None."""
    if not name:
        return "give a filename"
    if len(name) > MAX_FILENAME_LENGTH:
        return f"has {len(name)} characters; at most {MAX_FILENAME_LENGTH}"
    if not _FILENAME.match(name):
        return "must not contain a path separator (/ or \\) or a control character"
    if name.strip(". ") == "":
        return "must name a file, not only dots and spaces"
    _, dot, extension = name.rstrip(". ").rpartition(".")
    if dot and extension.lower() in BLOCKED_EXTENSIONS:
        return (
            f"is an executable type (.{extension.lower()}) that mailbox providers reject; "
            "send it in an archive they accept, or as a link"
        )
    return None


def content_type_problem(content_type: str) -> str | None:
    """Why `content_type` cannot be an attachment's type, or None."""
    if not _CONTENT_TYPE.match(content_type):
        return "is not a media type type/subtype (application/pdf, image/png…)"
    if content_type.lower().startswith(CONTAINER_TYPES):
        return "multipart/* and message/* cannot be attached as content; use application/octet-stream"
    return None
