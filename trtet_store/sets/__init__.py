"""Artifact sets: a release of many programs, each distinct file stored once.

``publish_set(members, "s3://bucket/prefix/")`` puts every distinct file of
every member once, content-addressed (``<prefix>blobs/<xxh3-128>``, each with
publish's guarantees), and commits the set with one manifest written last
(:mod:`.manifest`). ``fetch_set(url, dest)`` picks the member this machine
runs (:mod:`.machine`), downloads only the blobs the local content store
(:mod:`.store`) lacks, and places the member's files under the runtime's
names in one transaction (:mod:`.place`).

Uses only :mod:`trtet_store.io`'s and :mod:`trtet_store.remote`'s faces; knows no
ExecuTorch beyond what ``publish`` takes.
"""

from trtet_store.sets.fetch import fetch_set, read_set
from trtet_store.sets.machine import Machine, NoMemberFitsError, pick_member
from trtet_store.sets.manifest import SET_KEY, SetManifest, blob_key
from trtet_store.sets.publish import Member, publish_set
from trtet_store.sets.record import MemberCheck, verify_member
from trtet_store.sets.report import SetFetchReport, SetPublishReport
from trtet_store.sets.store import ContentStore

__all__ = [
    "SET_KEY",
    "ContentStore",
    "Machine",
    "Member",
    "MemberCheck",
    "NoMemberFitsError",
    "SetFetchReport",
    "SetManifest",
    "SetPublishReport",
    "blob_key",
    "fetch_set",
    "pick_member",
    "publish_set",
    "read_set",
    "verify_member",
]
