"""Source bundles in the store: kernels/src of one revision (kernels.source), kept once per content hash."""
from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kernels.source import KernelSource
from store.models import SourceBundle


def save_bundle(session: Session, source: KernelSource) -> str:
    """Store the bundle unless a bundle of the same content is stored already; returns its hash."""
    key = source.hash
    if session.get(SourceBundle, key) is not None:
        return key
    files = source.files
    try:
        # A savepoint: another API process storing the same content at the same moment is fine.
        with session.begin_nested():
            session.add(SourceBundle(hash=key, files=files, size_bytes=sum(len(t.encode()) for t in files.values())))
    except IntegrityError:
        pass
    return key


def load_bundle(session: Session, key: str) -> KernelSource | None:
    """The bundle stored under `key`, checked against its hash; None when there is none."""
    row = session.get(SourceBundle, key)
    if row is None:
        return None
    source = KernelSource.from_files(row.files)
    if source.hash != key:
        raise ValueError(f"source bundle {key} does not hash to its key (got {source.hash}): the store is corrupt")
    return source
