"""Where checkpoint storage may be: the syntax of a storage location.

A location is a local (or mounted shared) path, a ``file://`` URI or ``s3://bucket/prefix``.
These functions check and normalise one without touching storage, so a job's config
(``snapflow.checkpoint_config``), the coordinator's settings and its checkpoint storage
(``coordinator/checkpoint_storage.py``) apply the same rules.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from snapflow.errors import ConfigError, InvalidArgumentError, SnapflowError
from snapflow.filestore import is_object_store_uri

__all__ = ["check_storage_location", "has_uri_scheme", "local_path_from_uri", "s3_location"]

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# S3's bucket naming rules (general purpose buckets), loosely: 3-63 characters.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def has_uri_scheme(location: str) -> bool:
    """True when ``location`` starts with ``<scheme>://`` (any scheme)."""
    return _SCHEME_RE.match(location) is not None


def local_path_from_uri(location: str, *, what: str = "path") -> str:
    """Return the file-system path of ``location`` (a plain path or a ``file://`` URI).

    Any other URI scheme raises :class:`ConfigError` (``s3://`` included: callers that accept
    object storage check :func:`is_object_store_uri` first). The result is not made absolute.
    """
    match = _SCHEME_RE.match(location)
    if not match:
        return location
    scheme = match.group(1).lower()
    if scheme != "file":
        raise ConfigError(
            f"{what} {location!r:.200} uses the URI scheme {scheme!r}: only local or shared file "
            "systems (a plain path or a file:// URI) and S3 (s3://bucket/prefix) are supported"
        )
    parts = urlsplit(location)
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(
            f"{what} {location!r:.200} names the host {parts.netloc!r:.100}: a file:// URI must "
            "be file:///absolute/path (mount shared storage and use the local path)"
        )
    if parts.query or parts.fragment:
        raise ConfigError(
            f"{what} {location!r:.200}: a file:// URI must not have a query or fragment"
        )
    return unquote(parts.path)


def s3_location(
    location: str, *, what: str, error: type[SnapflowError] = InvalidArgumentError
) -> str:
    """``location`` (an ``s3://`` URI) normalised to ``s3://bucket/key/prefix`` without a
    trailing slash; raises ``error`` saying what to fix when it names no valid bucket, has a
    query, a NUL byte, or a ``.``/``..`` segment (S3 keys are literal: ``a/../b`` is not
    ``b``, so it is refused rather than resolved)."""
    parts = urlsplit(location)
    shown = f"{location!r:.200}"
    if parts.query or parts.fragment:
        raise error(f"{what} {shown}: an s3:// URI must not have a query or fragment")
    bucket = parts.netloc
    if not bucket:
        raise error(f"{what} {shown} names no bucket: write it as s3://bucket/prefix")
    if not _BUCKET_RE.match(bucket):
        raise error(
            f"{what} {shown}: {bucket!r:.80} is not a valid S3 bucket name (3-63 lower-case "
            "letters, digits, '.' and '-')"
        )
    key = unquote(parts.path)
    if "\x00" in key:
        raise error(f"{what} {shown} contains a NUL byte")
    segments = [s for s in key.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise error(
            f"{what} {shown} has a '.' or '..' segment: S3 keys are literal, so they are "
            "refused; write the location without them"
        )
    return f"s3://{bucket}/{'/'.join(segments)}" if segments else f"s3://{bucket}"


def check_storage_location(location: str, *, what: str) -> str:
    """Validate a storage root as given in the settings or a job's config: ``s3://`` (see
    :func:`s3_location`) or a local path/``file://`` URI. Returns the normalised S3 URI or the
    local path (not made absolute). Raises :class:`ConfigError`."""
    if is_object_store_uri(location):
        return s3_location(location, what=what, error=ConfigError)
    return local_path_from_uri(location, what=what)
