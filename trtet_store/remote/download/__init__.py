"""The download half: a published program back onto a disk, checked and resumable.

:mod:`.receive` (``fetch``: the steps in order) over :mod:`.options` (defaults,
bounds, the resume command), :mod:`.describe` (the manifest or a plain HEAD),
:mod:`.plan` (what to get, in ranges), :mod:`.reuse` (local bytes that need no
download), :mod:`.space` (the preflight), :mod:`.program` (the ``.pte``/``.ptd``
rules), :mod:`.verify` (chunk digests, full-object checksums), :mod:`.staging`
(the resume journal, its lock and the staged runs), :mod:`.ranges` (the download
step: missing ranges in parallel), :mod:`.reader` (ranged GETs) and :mod:`.writer`
(the one disk-writing thread). Never imports
:mod:`trtet_store.remote.upload`.
"""
