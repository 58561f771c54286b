"""A dataset's mirror on the Hugging Face Hub: list, download, record and read its Parquet files.

Endpoint: ``$HF_ENDPOINT``, the setting of the Hub's own clients (default
https://huggingface.co). Nothing but plain HTTPS GETs of the Hub's public API is used.

Listing: the mirror's own, at its pinned revision (a branch is first resolved to its commit
with ``/api/datasets/<repo>/revision/<branch>``): ``/api/datasets/<repo>/tree/<commit>/<folder>``
gives every file's size and, for a file in Git LFS (every Parquet file of the Hub), its
sha256. At the first download the listing is recorded in ``<dataset folder>/hub/mirror.json``
(a digest the listing lacks is recorded from the first downloaded file); every later download
and ``raydg data check`` is checked against that record without asking the Hub again.

Files: ``/datasets/<repo>/resolve/<commit>/<path>`` through :func:`raydg.download.fetch`
into ``<dataset folder>/hub/<path>``: resumed after a dropped connection, renamed into place
only once its size and sha256 match the record.

Layout: see :func:`class_names` (columns) and :func:`domain_counts` (domains, counts).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import posixpath
import re
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from raydg.datasets import DatasetSpec, HubMirror
from raydg.download import Archive, Log, fetch, file_digest, read_json
from raydg.errors import RaydgError, cut

ENDPOINT_ENV = "HF_ENDPOINT"
DEFAULT_ENDPOINT = "https://huggingface.co"
FOLDER = "hub"  # under the dataset's folder
RECORD = "mirror.json"  # in FOLDER
RETRIES = 3  # resumptions of a file after a dropped connection, within one download
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
LAYOUT = ("columns image {bytes, path}, domain (string), label (class label with names in "
          "the file's huggingface metadata)")


@dataclass(frozen=True)
class MirrorFile:
    """One Parquet file of the mirror, as listed."""

    path: str  # in the repository, e.g. data/train-00000-of-00001.parquet
    size: int  # bytes, from the listing
    sha256: str | None  # hex; None until the first download when the listing has none
    sha256_from: str  # "listing" (its LFS oid) or "first download"


@dataclass(frozen=True)
class Record:
    """The mirror's listing as recorded at the first download."""

    repo: str
    revision: str  # as pinned in raydg
    commit: str  # what the revision was at the first download
    files: tuple[MirrorFile, ...]

    @property
    def source(self) -> str:
        """The source of a run's images, as its MLflow record names it."""
        return f"hub:{self.repo}@{self.commit}"


def endpoint() -> str:
    """The Hub's address: ``$HF_ENDPOINT``, else https://huggingface.co."""
    return (os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")


def in_use(base: Path, domains: tuple[str, ...]) -> bool:
    """Whether the dataset in ``base`` is read from its Hub copy: there is one, and none of
    DomainBed's domain folders (which are read first)."""
    return (base / FOLDER / RECORD).is_file() and not any((base / d).exists() for d in domains)


def download(spec: DatasetSpec, root: Path, log: Log) -> Record:
    """Download ``spec``'s mirror into ``root/<folder>/hub``, check it, return its record."""
    assert spec.source is not None and spec.source.mirror is not None
    mirror, folder = spec.source.mirror, root / spec.folder / FOLDER
    record = read_record(folder)
    if record is None or (record.repo, record.revision) != (mirror.repo, mirror.revision):
        record = listing(mirror, log)
        write_record(folder, record)
    for f in record.files:
        fetch(Archive(resolve_url(record, f.path), f.path, f.size, sha256=f.sha256), folder,
              log, retries=RETRIES)
    record = _record_digests(folder, record, log)
    classes(folder, record)
    counts = domain_counts(folder, record, spec.domains)
    for d, n, want in zip(spec.domains, counts, spec.expected or counts, strict=True):
        if n != want:
            raise RaydgError(f"{record.source}: {n} images of {d}, the published count is "
                             f"{want}")
    log(f"{spec.name}: {sum(counts)} images in {len(record.files)} Parquet file(s) of "
        f"{record.source}")
    return record


def listing(mirror: HubMirror, log: Log) -> Record:
    """The mirror's Parquet files at its revision, from the Hub's tree API."""
    commit = mirror.revision if _COMMIT.fullmatch(mirror.revision) else _commit(mirror)
    if commit != mirror.revision:
        log(f"{mirror.repo}: revision {mirror.revision} is commit {commit}; recorded")
    folder = posixpath.dirname(mirror.pattern)
    url = (f"{endpoint()}/api/datasets/{mirror.repo}/tree/{_quote(commit)}/"
           f"{urllib.parse.quote(folder)}")
    answer = read_json(url)
    entries = answer if isinstance(answer, list) else []
    files = tuple(_listed(e, url) for e in entries if isinstance(e, dict)
                  and e.get("type") == "file" and fnmatch.fnmatch(str(e.get("path")),
                                                                  mirror.pattern))
    if not files:
        raise RaydgError(f"{url}: no file matches {mirror.pattern}")
    total = sum(f.size for f in files)
    if mirror.total_size is not None and total != mirror.total_size:
        raise RaydgError(f"{url}: the files of {mirror.pattern} hold {total} bytes, the "
                         f"dataset card says {mirror.total_size}")
    return Record(mirror.repo, mirror.revision, commit, tuple(sorted(files,
                                                                     key=lambda f: f.path)))


def _commit(mirror: HubMirror) -> str:
    """The commit that the branch ``mirror.revision`` points to now."""
    url = f"{endpoint()}/api/datasets/{mirror.repo}/revision/{_quote(mirror.revision)}"
    answer = read_json(url)
    sha = answer.get("sha") if isinstance(answer, dict) else None
    if not isinstance(sha, str) or not _COMMIT.fullmatch(sha):
        raise RaydgError(f"{url}: the answer names no commit")
    return sha


def _listed(entry: dict[str, Any], url: str) -> MirrorFile:
    """A tree entry as a :class:`MirrorFile` (sha256: the LFS oid, where there is one)."""
    size, lfs = entry.get("size"), entry.get("lfs")
    if not isinstance(size, int) or size < 0:
        raise RaydgError(f"{url}: no size for {entry.get('path')!r}")
    oid = lfs.get("oid") if isinstance(lfs, dict) else None
    if isinstance(oid, str) and _SHA256.fullmatch(oid):
        return MirrorFile(entry["path"], size, oid, "listing")
    return MirrorFile(entry["path"], size, None, "first download")


def resolve_url(record: Record, path: str) -> str:
    """Where the Hub serves the file ``path`` of the recorded commit."""
    return (f"{endpoint()}/datasets/{record.repo}/resolve/{_quote(record.commit)}/"
            f"{urllib.parse.quote(path)}")


def _quote(revision: str) -> str:
    return urllib.parse.quote(revision, safe="")


def _record_digests(folder: Path, record: Record, log: Log) -> Record:
    """``record`` with the sha256 of each file the listing gave none for, written down."""
    if all(f.sha256 for f in record.files):
        return record
    files = []
    for f in record.files:
        if f.sha256 is None:
            f = dataclasses.replace(f, sha256=file_digest(folder / f.path))
            log(f"{f.path}: sha256 {f.sha256} recorded at its first download")
        files.append(f)
    record = dataclasses.replace(record, files=tuple(files))
    write_record(folder, record)
    return record


def read_record(folder: Path) -> Record | None:
    """The record in ``folder`` (None: there is none)."""
    path = folder / RECORD
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text())
        files = tuple(MirrorFile(**f) for f in values.pop("files"))
        return Record(**values, files=files)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise RaydgError(f"{path} is damaged ({cut(str(err))}); delete it and download "
                         "again") from err


def write_record(folder: Path, record: Record) -> None:
    """Write ``record`` into ``folder`` atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (RECORD + ".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(record), indent=1) + "\n")
    os.replace(tmp, folder / RECORD)


def paths(folder: Path, record: Record) -> list[Path]:
    """The recorded files in ``folder``; a missing one is an error naming it."""
    out = [folder / f.path for f in record.files]
    for path in out:
        if not path.is_file():
            raise RaydgError(f"{path} is missing; run raydg data download again")
    return out


def problems(folder: Path) -> list[str]:
    """Each recorded file in ``folder`` that is missing or differs from the record."""
    record = read_record(folder)
    assert record is not None
    out = []
    for f in record.files:
        path = folder / f.path
        if not path.is_file():
            out.append(f"missing: {path}")
        elif (size := path.stat().st_size) != f.size:
            out.append(f"{path}: {size} bytes, recorded {f.size}")
        elif f.sha256 and (digest := file_digest(path)) != f.sha256:
            out.append(f"{path}: sha256 {digest}, recorded {f.sha256} (from the "
                       f"{f.sha256_from})")
    return out


def class_names(path: Path) -> list[str]:
    """The class names of the Parquet file ``path``, after checking that it is laid out as
    raydg reads it (:data:`LAYOUT`, flwrlabs' layout): the layout of a mirror that raydg
    could not inspect (Office-Home's) is checked here, and another one refused in one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise RaydgError(f"cannot read {path}: {cut(str(err))}") from err
    types = {f.name: f.type for f in schema}
    image = types.get("image")
    fields = {image.field(i).name: image.field(i).type
              for i in range(image.num_fields)} if pa.types.is_struct(image) else {}
    known = (_binary(fields.get("bytes")) and _string(fields.get("path"))
             and _string(types.get("domain")) and pa.types.is_integer(types.get("label")))
    names = _label_names(schema.metadata or {})
    if not known or names is None:
        found = ", ".join(f"{name} ({kind})" for name, kind in types.items())
        raise RaydgError(f"{path}: not a layout raydg reads (expected {LAYOUT}; found "
                         f"{cut(found, 200)})")
    return names


def classes(folder: Path, record: Record) -> list[str]:
    """The class names that every recorded file gives (:func:`class_names`)."""
    found = {tuple(class_names(path)) for path in paths(folder, record)}
    if len(found) > 1:
        raise RaydgError(f"{record.source}: its files name different classes: "
                         f"{cut(str(sorted(found)), 200)}")
    return list(found.pop())


def _binary(kind: Any) -> bool:
    import pyarrow as pa

    return kind is not None and (pa.types.is_binary(kind) or pa.types.is_large_binary(kind))


def _string(kind: Any) -> bool:
    import pyarrow as pa

    return kind is not None and (pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _label_names(metadata: dict[bytes, bytes]) -> list[str] | None:
    """The names of the ``label`` class label in a file's ``huggingface`` metadata."""
    try:
        label = json.loads(metadata[b"huggingface"])["info"]["features"]["label"]
        names = label["names"] if label.get("_type") == "ClassLabel" else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    ok = isinstance(names, list) and names and all(isinstance(n, str) for n in names)
    return names if ok else None


def domain_counts(folder: Path, record: Record, domains: tuple[str, ...]) -> list[int]:
    """Images per domain of ``domains``, in that order; a domain the mirror names otherwise
    is refused in one line."""
    import pyarrow.parquet as pq

    counts: Counter[str] = Counter()
    for path in paths(folder, record):
        counts.update(pq.read_table(path, columns=["domain"]).column("domain").to_pylist())
    unknown = sorted(map(str, set(counts) - set(domains)))
    if unknown:
        raise RaydgError(f"{record.source}: domain(s) {unknown} are not raydg's "
                         f"{list(domains)}")
    return [counts[d] for d in domains]


@dataclass(frozen=True)
class Image:
    """One encoded image of a domain in the mirror."""

    label: int  # index into the file's class names
    name: str  # its file name in the mirror ('' if none)
    data: bytes
    where: str  # the Parquet file

    def __str__(self) -> str:
        return f"{self.where}[{self.name or 'unnamed'}]"


def images(folder: Path, record: Record, domain: str) -> list[Image]:
    """The encoded images of ``domain``, in the files' order."""
    import pyarrow.parquet as pq

    out = []
    for path in paths(folder, record):
        table = pq.read_table(path, columns=["image", "label"], filters=[("domain", "==", domain)])
        for cell, label in zip(table.column("image").to_pylist(),
                               table.column("label").to_pylist(), strict=True):
            cell = cell or {}  # a missing image: unreadable, as an empty file is
            name = PurePosixPath(cell.get("path") or "").name
            out.append(Image(label, name, cell.get("bytes") or b"", str(path)))
    return out
