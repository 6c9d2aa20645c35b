"""DKIM signing (RFC 6376) of the mail emailhub sends over SMTP; SES and SendGrid sign for us.

Dual signing: a domain may have an RSA key (rsa-sha256) and an Ed25519 key (ed25519-sha256,
RFC 8463); the message then carries one DKIM-Signature per key, each over the same headers,
so a receiver that does not know Ed25519 yet still verifies the RSA one. Canonicalization is
relaxed/relaxed (§3.4.2, §3.4.4): it survives the header refolding and trailing-space
trimming relays do.

The cryptography is OpenSSL's through `cryptography`: dkimpy's pure-Python RSA costs ~15 ms per
signature on this machine, which would cut campaign throughput tenfold; OpenSSL's RSA-2048 costs
well under a millisecond (bench/dkim.py prints the figures). The canonicalization is a few
regular expressions over bytes; dkimpy verifies what this writes in tests/test_dkim.py.

Keys come from `EMAILHUB_DKIM_KEYS` and are loaded once per process, when the SMTP provider is
built (worker start-up runs check_provider_settings, so a key that cannot be loaded stops the
worker, naming the setting):

- JSON: ``{"example.com": [{"selector": "rsa2026", "key": "/etc/dkim/example.com.rsa.pem"},
  {"selector": "ed2026", "key": "/etc/dkim/example.com.ed25519.pem"}]}``, or
- a directory: ``<dir>/<domain>/<selector>.pem``, one file per key.

The algorithm is the key's own type (an RSA or an Ed25519 PKCS#8 PEM); the signing domain (d=)
is the From address's domain or, failing a key for it, its nearest parent domain with one (a
From of news.example.com signs as example.com, which DMARC's relaxed alignment accepts).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa

from delivery.exceptions import ProviderConfigurationError

SETTING = "EMAILHUB_DKIM_KEYS"
RSA_SHA256 = "rsa-sha256"
ED25519_SHA256 = "ed25519-sha256"

# The headers signed when present, in this order. RFC 6376 §5.4.1 asks for From (required) and
# what a reader sees or a client acts on; RFC 8058 §4 requires List-Unsubscribe and
# List-Unsubscribe-Post to be covered, or Gmail and Yahoo ignore the one-click header. Only
# headers the message has are listed: signing an absent Cc would forbid every later Cc, fine,
# but an absent header also gains nothing a reader could be fooled by.
SIGNED_HEADERS = (
    "from",
    "to",
    "cc",
    "reply-to",
    "subject",
    "date",
    "message-id",
    "in-reply-to",
    "references",
    "mime-version",
    "content-type",
    "content-transfer-encoding",
    "list-id",
    "list-unsubscribe",
    "list-unsubscribe-post",
)
# Oversigning (RFC 6376 §8.15): every signed header is listed once more than it occurs, and a
# listed instance that does not exist counts as empty. A second From, Subject or
# List-Unsubscribe added in transit (a receiver might show or use that one while DKIM vouched
# for the other) then breaks the signature. No relay legitimately adds a second instance of any
# of these, so the cost is only a longer h= (about 200 bytes); a mailing list that adds its own
# List-Unsubscribe re-sends under its own signature (and ARC) anyway.
OVERSIGN = True

# base64 lines in b=; 72 keeps every folded line under RFC 5322's 78.
_B64_LINE = 72
_MAX_LINE = 78
_SELECTOR = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?)*$"
)
# RFC 8301 §3.2: verifiers must not accept RSA keys shorter than 1024 bits; 2048 is the norm.
_MIN_RSA_BITS = 1024

_TRAILING_WSP = re.compile(rb"[ \t]+(?=\r\n|\Z)")
_WSP_RUN = re.compile(rb"[ \t]{2,}|\t")  # what relaxed changes: a tab, or two or more WSP
_TRAILING_EMPTY_LINES = re.compile(rb"(?:\r\n)+\Z")


@dataclass(frozen=True, slots=True)
class DkimKey:
    domain: str  # lower-case, ASCII (IDNA): what goes in d=
    selector: str
    private_key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey

    @property
    def algorithm(self) -> str:
        return RSA_SHA256 if isinstance(self.private_key, rsa.RSAPrivateKey) else ED25519_SHA256

    def dns_name(self) -> str:
        return f"{self.selector}._domainkey.{self.domain}"

    def dns_record(self) -> str:
        """The TXT record to publish at dns_name() (RFC 6376 §3.6.1, RFC 8463 §4.2)."""
        public = self.private_key.public_key()
        if isinstance(public, ed25519.Ed25519PublicKey):
            raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            return f"v=DKIM1; k=ed25519; p={base64.b64encode(raw).decode('ascii')}"
        der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return f"v=DKIM1; k=rsa; p={base64.b64encode(der).decode('ascii')}"

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.private_key, rsa.RSAPrivateKey):
            return self.private_key.sign(data, padding.PKCS1v15(), hashes.SHA256())
        # RFC 8463 §3: Ed25519 (PureEdDSA) signs the SHA-256 hash of the header data, not the data.
        return self.private_key.sign(hashlib.sha256(data).digest())


class DkimSigner:
    """The keys of every sending domain; `sign` adds one DKIM-Signature per key of the domain."""

    def __init__(self, keys: Iterable[DkimKey] = ()) -> None:
        self._keys: dict[str, list[DkimKey]] = {}
        for key in keys:
            self._keys.setdefault(key.domain, []).append(key)
        for domain_keys in self._keys.values():
            # No receiver depends on the order of the signatures; a fixed one (RSA first) keeps
            # two renderings of a message comparable.
            domain_keys.sort(key=lambda key: (key.algorithm != RSA_SHA256, key.selector))

    @classmethod
    def from_setting(cls, value: str | Mapping[str, object]) -> DkimSigner:
        """Keys from the setting's value (JSON text, a parsed mapping or a directory path; empty:
        no keys). Raises ProviderConfigurationError naming EMAILHUB_DKIM_KEYS."""
        if isinstance(value, Mapping):
            return cls(_keys_from_mapping(value))
        text = value.strip()
        if not text:
            return cls()
        if text.startswith("{"):
            try:
                parsed = json.loads(text)
            except ValueError as exc:
                raise ProviderConfigurationError(f"{SETTING} is not valid JSON: {exc}") from exc
            if not isinstance(parsed, dict):
                raise ProviderConfigurationError(f"{SETTING} must be a JSON object: domain → list of keys")
            return cls(_keys_from_mapping(parsed))
        return cls(_keys_from_directory(Path(text)))

    @property
    def domains(self) -> list[str]:
        return sorted(self._keys)

    def keys_for(self, domain: str) -> Sequence[DkimKey]:
        """The keys for a From domain: its own, else its nearest parent's (relaxed alignment)."""
        labels = _ascii_domain(domain).split(".")
        for start in range(len(labels) - 1):
            keys = self._keys.get(".".join(labels[start:]))
            if keys:
                return keys
        return ()

    def sign(self, message: bytes, *, from_domain: str, timestamp: int | None = None) -> bytes:
        """`message` (CRLF bytes, headers then body) with a DKIM-Signature per key prepended;
        unchanged when the domain has no key."""
        keys = self.keys_for(from_domain)
        if not keys:
            return message
        return sign_message(message, keys, timestamp=timestamp)


def sign_message(message: bytes, keys: Sequence[DkimKey], *, timestamp: int | None = None) -> bytes:
    head, separator, body = message.partition(b"\r\n\r\n")
    if not separator:
        head, body = message, b""
    headers = _split_headers(head)
    body_hash = base64.b64encode(hashlib.sha256(canonicalize_body(body)).digest()).decode("ascii")
    names = _header_list(headers)
    if "from" not in names:
        # RFC 6376 §5.4: From must be signed. mime.render always writes one; this is a bug guard
        # (a ValueError makes the message unbuildable, not the address suppressed).
        raise ValueError("a message without a From header cannot be DKIM-signed")
    # The header data is the same for every key; only the DKIM-Signature header itself differs.
    signed = _signed_header_data(headers, names)
    stamp = int(time.time()) if timestamp is None else timestamp
    signatures = []
    for key in keys:
        unsigned = _signature_header(key, names, body_hash, stamp)
        data = signed + canonicalize_header(unsigned).removesuffix(b"\r\n")
        signatures.append(unsigned + _fold_b64(base64.b64encode(key.sign(data))) + b"\r\n")
    return b"".join(signatures) + message


def canonicalize_header(line: bytes) -> bytes:
    """RFC 6376 §3.4.2 relaxed: lower-case name, unfolded, runs of WSP one space, no WSP around
    the colon or at the end; ends with CRLF."""
    name, _, value = line.partition(b":")
    # Every CRLF inside a field is a fold (it is followed by WSP: _split_headers joins only
    # those). The regex runs only when there is WSP to collapse, as in canonicalize_body.
    value = value.replace(b"\r\n", b"")
    if b"\t" in value or b"  " in value:
        value = _WSP_RUN.sub(b" ", value)
    return name.rstrip(b" \t").lower() + b":" + value.strip(b" ") + b"\r\n"


def canonicalize_body(body: bytes) -> bytes:
    """RFC 6376 §3.4.4 relaxed: no WSP at line ends, runs of WSP one space, no empty lines at
    the end, and a non-empty body ends with CRLF."""
    # The regular expressions are run only when their pattern can occur: what mime.render writes
    # is quoted-printable (no trailing whitespace, =20 instead), so usually neither is needed,
    # and running both cost ~150 µs on a 3 KB message here, more than the Ed25519 signature.
    if b" \r\n" in body or b"\t\r\n" in body or body.endswith((b" ", b"\t")):
        body = _TRAILING_WSP.sub(b"", body)
    if b"\t" in body or b"  " in body:
        body = _WSP_RUN.sub(b" ", body)
    if body.endswith(b"\r\n\r\n"):
        body = _TRAILING_EMPTY_LINES.sub(b"\r\n", body)
    if body == b"\r\n":
        return b""  # only empty lines: the empty body
    return body if not body or body.endswith(b"\r\n") else body + b"\r\n"


def _split_headers(head: bytes) -> list[tuple[str, bytes]]:
    """(lower-case name, the whole field with its continuation lines, no final CRLF), in order."""
    fields: list[tuple[str, bytes]] = []
    for line in head.split(b"\r\n"):
        if line[:1] in (b" ", b"\t") and fields:
            name, previous = fields[-1]
            fields[-1] = (name, previous + b"\r\n" + line)
        elif line:
            fields.append((line.partition(b":")[0].strip().lower().decode("ascii", "replace"), line))
    return fields


def _header_list(headers: Sequence[tuple[str, bytes]]) -> list[str]:
    counts: dict[str, int] = {}
    for name, _ in headers:
        counts[name] = counts.get(name, 0) + 1
    names: list[str] = []
    for name in SIGNED_HEADERS:
        count = counts.get(name, 0)
        if count:
            names.extend([name] * (count + 1 if OVERSIGN else count))
    return names


def _signed_header_data(headers: Sequence[tuple[str, bytes]], names: Sequence[str]) -> bytes:
    # §5.4.2: a name listed n times takes that field's instances from the bottom up; a listed
    # instance that does not exist (oversigning) contributes nothing.
    remaining: dict[str, list[bytes]] = {}
    for name, line in headers:
        remaining.setdefault(name, []).append(line)
    parts = []
    for name in names:
        instances = remaining.get(name)
        if instances:
            parts.append(canonicalize_header(instances.pop()))
    return b"".join(parts)


def _signature_header(key: DkimKey, names: Sequence[str], body_hash: str, timestamp: int) -> bytes:
    """The DKIM-Signature field with an empty b=, folded; b= is last so its value can be
    appended once computed (the verifier removes that value before hashing, §3.7)."""
    lines = ["DKIM-Signature: v=1;"]

    def add(piece: str, separator: str = " ") -> None:
        if len(lines[-1]) + len(separator) + len(piece) > _MAX_LINE:
            lines.append(" " + piece)
        else:
            lines[-1] += separator + piece

    for piece in (
        f"a={key.algorithm};",
        "c=relaxed/relaxed;",
        f"d={key.domain};",
        f"s={key.selector};",
        f"t={timestamp};",
        f"bh={body_hash};",
    ):
        add(piece)
    h_pieces = [f"{name}:" for name in names]
    h_pieces[0] = "h=" + h_pieces[0]
    h_pieces[-1] = h_pieces[-1][:-1] + ";"
    add(h_pieces[0])
    for piece in h_pieces[1:]:
        add(piece, separator="")  # h= is folded only between names (FWS around ':', §3.5)
    lines.append(" b=")
    return "\r\n".join(lines).encode("ascii")


def _fold_b64(value: bytes) -> bytes:
    first = _MAX_LINE - len(" b=")
    chunks = [value[:first]] + [value[i : i + _B64_LINE] for i in range(first, len(value), _B64_LINE)]
    return b"\r\n ".join(chunk for chunk in chunks if chunk)


def _ascii_domain(domain: str) -> str:
    domain = domain.strip().rstrip(".").lower()
    if not domain.isascii():
        domain = domain.encode("idna").decode("ascii")
    return domain


def _keys_from_mapping(value: Mapping[str, object]) -> list[DkimKey]:
    keys = []
    for domain, entries in value.items():
        if not isinstance(entries, list) or not entries:
            raise ProviderConfigurationError(
                f"{SETTING}: {domain!r} must map to a list of {{'selector': ..., 'key': <PEM path>}}"
            )
        for entry in entries:
            if not isinstance(entry, dict) or set(entry) != {"selector", "key"}:
                raise ProviderConfigurationError(
                    f"{SETTING}: each key of {domain!r} is {{'selector': ..., 'key': <PEM path>}}, got {entry!r}"
                )
            keys.append(_load_key(str(domain), str(entry["selector"]), Path(str(entry["key"]))))
    return keys


def _keys_from_directory(directory: Path) -> list[DkimKey]:
    if not directory.is_dir():
        raise ProviderConfigurationError(
            f"{SETTING} is neither a JSON object nor a directory: {str(directory)!r} is not a directory"
        )
    keys = [
        _load_key(path.parent.name, path.stem, path)
        for path in sorted(directory.glob("*/*.pem"))
        if path.parent.is_dir()
    ]
    if not keys:
        raise ProviderConfigurationError(f"{SETTING}: no <domain>/<selector>.pem key under {directory}")
    return keys


def _load_key(domain: str, selector: str, path: Path) -> DkimKey:
    where = f"{SETTING}: the key for {domain!r} selector {selector!r} ({path})"
    if not _SELECTOR.match(selector):
        raise ProviderConfigurationError(f"{where}: {selector!r} is not a valid selector (RFC 6376 §3.1)")
    try:
        ascii_domain = _ascii_domain(domain)
    except UnicodeError as exc:
        raise ProviderConfigurationError(f"{where}: {domain!r} is not a valid domain") from exc
    if "." not in ascii_domain:
        raise ProviderConfigurationError(f"{where}: {domain!r} is not a domain name")
    try:
        private_key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ProviderConfigurationError(f"{where} cannot be loaded: {exc}") from exc
    if isinstance(private_key, rsa.RSAPrivateKey):
        if private_key.key_size < _MIN_RSA_BITS:
            raise ProviderConfigurationError(
                f"{where} is RSA-{private_key.key_size}; receivers refuse keys under {_MIN_RSA_BITS} bits "
                "(RFC 8301), use 2048"
            )
    elif not isinstance(private_key, ed25519.Ed25519PrivateKey):
        raise ProviderConfigurationError(
            f"{where} is a {type(private_key).__name__}; DKIM takes RSA or Ed25519 keys"
        )
    return DkimKey(domain=ascii_domain, selector=selector, private_key=private_key)
