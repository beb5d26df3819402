"""Media bytes from what a request names: a data URL, bare base64, raw bytes, or a local file under
`--allowed-local-media-path`. Nothing is fetched over the network: a remote URL is refused."""

from __future__ import annotations

import base64
import binascii
import os
import re

from sgl_inkling.multimodal.errors import MediaError

MAX_MEDIA_BYTES = 32 * 1024 * 1024  # one encoded image or clip
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("media data is not valid base64") from None


def _refused_path(path: str, allowed: str | None) -> MediaError:
    if not allowed:
        return MediaError("local media paths are not allowed on this server (see --allowed-local-media-path)")
    # One answer whether the file is missing or outside the directory: no oracle for what exists.
    return MediaError(f"local media path {path!r} is not a file under --allowed-local-media-path")


def _local(path: str, allowed: str | None) -> bytes:
    if not allowed:
        raise _refused_path(path, allowed)
    real, root = os.path.realpath(path), os.path.realpath(allowed)
    if os.path.commonpath([real, root]) != root or not os.path.isfile(real):
        raise _refused_path(path, allowed)
    if os.path.getsize(real) > MAX_MEDIA_BYTES:
        raise MediaError(f"media file {path!r} is too large (limit {MAX_MEDIA_BYTES} bytes)")
    with open(real, "rb") as f:
        return f.read()


def load_bytes(source: str | bytes, allowed_local_path: str | None) -> tuple[bytes, str | None]:
    """(bytes, MIME subtype named by a data URL or None)."""
    if isinstance(source, (bytes, bytearray)):
        data, subtype = bytes(source), None
    elif not isinstance(source, str) or not source:
        raise MediaError("media must be a data URL, base64 text or an allowed local path")
    elif source.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep or not header.endswith(";base64"):
            raise MediaError("a media data URL must be base64: data:<type>;base64,<data>")
        mime = header[5:-7]
        subtype = mime.split("/", 1)[1].lower() if "/" in mime else None
        if len(payload) > MAX_MEDIA_BYTES * 4 // 3 + 4:
            raise MediaError(f"media is too large (limit {MAX_MEDIA_BYTES} bytes)")
        data = _b64(payload)
    elif source.startswith("file://"):
        return _local(source[7:], allowed_local_path), None
    elif _SCHEME.match(source):
        raise MediaError("remote media URLs are not fetched; send the bytes as a data URL or base64")
    elif len(source) < 4096 and os.path.exists(source):
        # Checked by existence, not by shape: base64 text may start with "/" (JPEG's does).
        return _local(source, allowed_local_path), None
    else:
        if len(source) > MAX_MEDIA_BYTES * 4 // 3 + 4:
            raise MediaError(f"media is too large (limit {MAX_MEDIA_BYTES} bytes)")
        try:
            data, subtype = base64.b64decode(source, validate=True), None
        except (binascii.Error, ValueError):
            if source.startswith(("/", "./", "../", "~")):  # meant as a path: answer as for any path
                raise _refused_path(source, allowed_local_path) from None
            raise MediaError("media is not a data URL, base64 data or an allowed local path") from None
    if len(data) > MAX_MEDIA_BYTES:
        raise MediaError(f"media is too large (limit {MAX_MEDIA_BYTES} bytes)")
    if not data:
        raise MediaError("media data is empty")
    return data, subtype
