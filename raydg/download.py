"""Download and verify the files of a dataset (standard library only; :mod:`raydg.archives`
unpacks them).

``fetch`` writes to ``<filename>.part`` and renames it to ``<filename>`` only once
``verify`` has passed, so a file under its final name is always complete. A file already
there that verifies is returned without touching the network.

Resume: a ``.part`` left by an interrupted download is continued with a
``Range: bytes=N-`` request. A ``206`` answer is appended to the part; a ``200`` (the server
ignores ranges) restarts from zero; a ``416`` means the part already holds the whole file,
so it is only verified. Network failures raise a one-line ``RaydgError`` and keep the part;
with ``retries`` they (HTTP 429 and 5xx included, not other HTTP errors) are first resumed
that many times, after 1, 2, 4... s.

Verification: the size, md5 and sha256 that the ``Archive`` gives are checked (digests
streamed in 1 MiB chunks); a mismatching file is deleted, so the next call starts afresh.

Google Drive: large files first answer with an HTML virus-scan warning whose ``<form>``
(action and hidden inputs) is resubmitted as a GET query to get the file itself.
"""

from __future__ import annotations

import hashlib
import http.client
import http.cookiejar
import json
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import IO, Any

from raydg.errors import RaydgError

_CHUNK = 1 << 20
_MAX_PAGE = 1 << 21  # read at most this much of an HTML answer
_LOG_EVERY_S = 10.0
_USER_AGENT = "raydg-download/0.1 (Python urllib)"
_NET_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError,
               TimeoutError, ssl.SSLError)

Log = Callable[[str], None]


@dataclass(frozen=True)
class Archive:
    """One downloadable file of a dataset."""

    url: str  # http(s) URL (use drive_url(file_id) for Google Drive)
    filename: str  # file name inside the download folder
    size: int | None = None  # expected bytes, verified when given
    md5: str | None = None  # expected hex md5, verified when given
    sha256: str | None = None  # expected hex sha256, verified when given


class _HtmlPage(Exception):
    """The server answered with an HTML page instead of the file."""


def drive_url(file_id: str) -> str:
    """Direct-download URL of a Google Drive file id."""
    query = urllib.parse.urlencode({"id": file_id, "export": "download"})
    return f"https://drive.usercontent.google.com/download?{query}"


def fetch(archive: Archive, folder: Path, log: Log = print, timeout: float = 30.0,
          retries: int = 0) -> Path:
    """Download ``archive`` into ``folder`` (resuming a ``.part``, and after a network failure
    up to ``retries`` times), verify it, return its path."""
    final = Path(folder) / archive.filename
    if final.exists():
        try:
            verify(final, archive)
        except RaydgError as err:
            log(f"{err}; downloading it again")
        else:
            log(f"{final}: already downloaded")
            return final
    final.parent.mkdir(parents=True, exist_ok=True)
    part = final.with_name(final.name + ".part")
    try:
        _download_retrying(archive, part, log, timeout, retries)
    except _NET_ERRORS as err:
        raise RaydgError(f"cannot download {archive.url}: {_reason(err)}; check the network "
                         f"(offline?) or place the file at {final}") from err
    except _HtmlPage as err:
        raise RaydgError(f"cannot download {archive.url}: {err} (Google Drive quota exceeded "
                         f"or file removed?); download it by hand and place it at {final}"
                         ) from err
    except OSError as err:
        raise RaydgError(f"cannot write {part}: {_reason(err)}") from err
    verify(part, archive)
    os.replace(part, final)
    log(f"saved {final} ({_human(final.stat().st_size)})")
    return final


def verify(path: Path, archive: Archive) -> None:
    """Check size, md5 and sha256 of ``path`` where ``archive`` gives them; delete it on
    mismatch."""
    path = Path(path)
    if not path.is_file():
        raise RaydgError(f"{path}: no such file")
    if archive.size is not None and (got := path.stat().st_size) != archive.size:
        _reject(path, f"expected {archive.size} bytes, got {got}")
    for name, want in (("md5", archive.md5), ("sha256", archive.sha256)):
        if want is not None and (digest := file_digest(path, name)) != want.lower():
            _reject(path, f"expected {name} {want.lower()}, got {digest}")


def file_digest(path: Path, name: str = "sha256") -> str:
    """Hex digest ``name`` (a hashlib algorithm) of the file ``path``, read in 1 MiB chunks."""
    digest = hashlib.new(name)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_json(url: str, timeout: float = 30.0) -> Any:
    """The JSON document at ``url`` (at most 2 MiB); a one-line ``RaydgError`` if it cannot
    be had."""
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT,
                                                   "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read(_MAX_PAGE))
    except _NET_ERRORS as err:
        raise RaydgError(f"cannot read {url}: {_reason(err)}") from err
    except ValueError as err:  # json.JSONDecodeError and UnicodeDecodeError
        raise RaydgError(f"cannot read {url}: not JSON ({_reason(err)})") from err


# --- download -------------------------------------------------------------------------------


def _download_retrying(archive: Archive, part: Path, log: Log, timeout: float,
                       retries: int) -> None:
    """:func:`_download`, resumed up to ``retries`` times after a network failure (not
    after an HTTP error other than 429 and 5xx: the answer would be the same)."""
    for attempt in range(retries):
        try:
            return _download(archive, part, log, timeout)
        except _NET_ERRORS as err:
            if isinstance(err, urllib.error.HTTPError) and err.code != 429 and err.code < 500:
                raise
            log(f"{archive.filename}: {_reason(err)}; resuming in {2 ** attempt} s "
                f"(retry {attempt + 1} of {retries})")
            time.sleep(2 ** attempt)
    return _download(archive, part, log, timeout)


def _download(archive: Archive, part: Path, log: Log, timeout: float) -> None:
    """Bring ``part`` to the full file, resuming from its current length."""
    offset = part.stat().st_size if part.exists() else 0
    if archive.size is not None and offset > archive.size:
        part.unlink()
        offset = 0
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    resp = _open(opener, archive.url, offset, timeout)
    if resp is None:
        log(f"{part.name}: already complete ({_human(offset)}), verifying")
        return
    with resp:
        if offset and resp.status == 206:
            _check_range_start(resp, offset, part)
            mode, done, total = "ab", offset, _range_total(resp.headers.get("Content-Range"))
        else:
            if offset:
                log(f"{archive.url}: server ignored the resume request, restarting")
            mode, done, total = "wb", 0, _int(resp.headers.get("Content-Length"))
        total = total if total is not None else archive.size
        size = _human(total) if total else "size unknown"
        resume = f", resuming at {_human(done)}" if done else ""
        log(f"downloading {archive.url} ({size}) -> {part}{resume}")
        with open(part, mode) as out:
            done = _copy(resp, out, _Progress(log, archive.filename, done, total))
    if total is not None and done < total:
        raise ConnectionError(f"connection closed after {done} of {total} bytes")


def _open(opener: urllib.request.OpenerDirector, url: str, offset: int,
          timeout: float) -> http.client.HTTPResponse | None:
    """Open ``url`` from ``offset``, following a Drive confirmation form; None on 416."""
    for _ in range(3):
        headers = {"User-Agent": _USER_AGENT}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            resp = opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)
        except urllib.error.HTTPError as err:
            err.close()
            if err.code == 416 and offset:
                return None
            raise
        if resp.headers.get_content_type() != "text/html":
            return resp
        with resp:
            page = resp.read(_MAX_PAGE).decode(resp.headers.get_content_charset() or "utf-8",
                                               "replace")
        url = _confirm_url(page, resp.url)
        if url is None:
            raise _HtmlPage("the server sent an HTML page without a download form")
    raise _HtmlPage("the server kept asking for a confirmation")


def _copy(resp: IO[bytes], out: IO[bytes], progress: _Progress) -> int:
    """Stream ``resp`` into ``out``; return the total bytes now in the part."""
    while chunk := resp.read(_CHUNK):
        out.write(chunk)
        progress.add(len(chunk))
    return progress.done


def _check_range_start(resp: http.client.HTTPResponse, offset: int, part: Path) -> None:
    """A 206 must start where the part ends; otherwise drop the part and fail."""
    match = re.match(r"bytes\s+(\d+)-", resp.headers.get("Content-Range") or "")
    if match is None or int(match.group(1)) != offset:
        part.unlink()
        raise http.client.HTTPException(f"server resumed at the wrong byte (asked {offset}, "
                                        f"got {resp.headers.get('Content-Range')!r})")


def _range_total(content_range: str | None) -> int | None:
    """Full length from a ``Content-Range: bytes a-b/total`` header."""
    match = re.search(r"/(\d+)\s*$", content_range or "")
    return int(match.group(1)) if match else None


def _int(value: str | None) -> int | None:
    return int(value) if value and value.strip().isdigit() else None


class _FormParser(HTMLParser):
    """Collect the action and named inputs of the first ``<form>`` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self._state = "before"  # before -> inside -> after

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "form" and self._state == "before":
            self._state, self.action = "inside", values.get("action", "")
        elif tag == "input" and self._state == "inside" and values.get("name"):
            self.fields[values["name"]] = values.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self._state == "inside":
            self._state = "after"


def _confirm_url(page: str, page_url: str) -> str | None:
    """GET URL that submits the page's form, or None when the page has no form."""
    parser = _FormParser()
    parser.feed(page)
    parser.close()
    if parser.action is None:
        return None
    action = urllib.parse.urljoin(page_url, parser.action)
    if not parser.fields:
        return action
    sep = "&" if urllib.parse.urlsplit(action).query else "?"
    return action.split("#")[0] + sep + urllib.parse.urlencode(parser.fields)


class _Progress:
    """Log one line per 10 % step, or after 10 s without one (size unknown, slow link)."""

    def __init__(self, log: Log, name: str, done: int, total: int | None) -> None:
        self.log, self.name, self.done, self.total = log, name, done, total
        self.last = time.monotonic()
        self.next_pct = self._pct() // 10 * 10 + 10 if total else None

    def _pct(self) -> int:
        return self.done * 100 // self.total if self.total else 0

    def add(self, n: int) -> None:
        self.done += n
        if self.total and self.done >= self.total:
            return  # the final line says it
        now = time.monotonic()
        due = self.next_pct is not None and self._pct() >= self.next_pct
        if due or now - self.last >= _LOG_EVERY_S:
            of = f" of {_human(self.total)}, {self._pct()}%" if self.total else ""
            self.log(f"  {self.name}: {_human(self.done)}{of}")
            self.last = now
            if self.next_pct is not None:
                self.next_pct = self._pct() // 10 * 10 + 10


# --- verify ---------------------------------------------------------------------------------


def _reject(path: Path, what: str) -> None:
    path.unlink(missing_ok=True)
    raise RaydgError(f"{path} is corrupt: {what} (deleted it; download it again)")


# --- messages -------------------------------------------------------------------------------


def _reason(err: BaseException) -> str:
    """One-line reason of a network or file error."""
    if isinstance(err, urllib.error.HTTPError):
        text = f"HTTP {err.code} {err.reason}"
    elif isinstance(err, urllib.error.URLError):
        reason = err.reason
        text = str(reason.strerror or reason) if isinstance(reason, OSError) else str(reason)
    elif isinstance(err, TimeoutError):
        text = str(err) or "timed out"
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())


def _human(n: int | None) -> str:
    value, unit = float(n or 0), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
