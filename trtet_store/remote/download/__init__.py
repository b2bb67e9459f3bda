"""The download half: a published program back onto a disk, checked and resumable.

:mod:`.receive` (``fetch``) over :mod:`.plan` (what to get, in ranges),
:mod:`.reuse` (local bytes that need no download), :mod:`.staging` (the
resume journal, its lock and the staged runs), :mod:`.reader` (ranged GETs)
and :mod:`.writer` (the one disk-writing thread). Never imports
:mod:`trtet_store.remote.upload`.
"""
