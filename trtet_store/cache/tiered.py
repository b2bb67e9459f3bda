"""The two-level policy, written once: a local :class:`BlobCache` first, a shared tier second.

:class:`TieredCache` is what both the engine cache and the Torch-TensorRT
adapter do with the shared tier (:mod:`trtet_store.cache.tier`). It knows no
TensorRT: keys and metadata are opaque, and each caller hands it

- ``accept(entry) -> str | None``: why a shared entry must not be served here
  (another GPU, other versions, another kind), or None;
- ``places(entry) -> [(file name, local key, metadata), ...]``: where each
  file of an entry goes in the local cache, in the order it is entered (the
  entry that makes the build a hit last).

The rules:

- ``get``: the local cache first; else the tier's entry, its signature, the
  caller's ``accept``, the download into ``<directory>/downloads/<key>/``
  (verified by the tier), each file entered by ``put(consume=True)`` (a hard
  link: no second copy); a download the local cache does not take is served
  once from ``downloads/`` and removed when closed.
- ``claim``: the key's lease around a build (one build across machines).
- ``publish``: first writer wins (``If-None-Match: *``); an entry that was
  damaged, refused or not accepted is remembered and replaced (``If-Match``
  that entry only). A build cached here and not yet published is marked in
  ``<directory>/remote-pending/<key>``.
- ``push`` and ``pull``: the same steps, with the tier's errors raised.
- One :class:`~trtet_store.cache.tier.health.TierHealth`: a tier that fails
  is warned once (a :class:`SharedCacheWarning` too), then "works again".
  What counts as the tier failing is :data:`TIER_ERRORS`, nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtet_store.cache.layout import DOWNLOADS, ORIGIN_FILE, PENDING, REMOTE_JOURNAL
from trtet_store.cache.results import TierOutcome
from trtet_store.io import write_atomic

if TYPE_CHECKING:
    from trtet_store.cache.blobcache import BlobCache
    from trtet_store.cache.results import PutResult
    from trtet_store.cache.tier import LeaseWait, RemoteEntry, RemoteTier, TierPublish
    from trtet_store.io import Digests

__all__ = ["Places", "TierGet", "TieredCache", "Voice", "tier_errors"]

log = logging.getLogger("trtet_store.engine_cache")

#: A caller's map of an entry's files into the local cache: (file name, local key, metadata).
Places = Callable[["RemoteEntry"], Sequence[tuple[str, str, dict[str, Any]]]]


def tier_errors() -> tuple[type[BaseException], ...]:
    """:data:`trtet_store.cache.tier.TIER_ERRORS` (loads the tier: the remote floor)."""
    from trtet_store.cache.tier.errors import TIER_ERRORS

    return TIER_ERRORS


@dataclass
class Voice:
    """A caller's own words for the tier's trouble; the policy decides when each is said.

    Each callable returns the one line said (a log warning and a
    :class:`SharedCacheWarning` the first time).
    """

    #: ``(what, key, exc, said) -> (line, reason)``: a tier call failed (``what``: lookup,
    #: claim, publish...); ``said`` replaces the caller's words (a failed download's line).
    failed: Callable[[str, str, BaseException, str | None], tuple[str, str]]
    #: ``() -> line``: the tier works again after a failure.
    works: Callable[[], str]
    #: ``(key, exc) -> line``: one entry failed its checks (damaged, refused), never served.
    damaged: Callable[[str, BaseException], str]
    #: ``(key, entry, why) -> line``: an entry its trusted keys refuse, never served.
    refused: Callable[[str, Any, str], str]
    #: ``(key, entry, problem) -> line``: an entry ``accept`` refused (another GPU...).
    not_served: Callable[[str, Any, str], str]
    #: ``(file name, key, put result) -> line or None``: a downloaded file entered (INFO).
    placed: Callable[[str, str, PutResult], str | None] | None = None
    #: ``(key, exc, seen, directory) -> line``: a remote hit's download failed (optional).
    download_failed: Callable[[str, BaseException, Any, Path], str] | None = None


@dataclass
class TierGet:
    """What :meth:`TieredCache.get` found.

    ``hit`` is the caller's local hit (from its ``local``), or None.
    ``download`` is the verified download the local cache did not take
    (served once; closed removes it), with ``why`` it was not taken.
    ``outcome`` says what the tier did (None: not asked: a local hit or no
    tier). ``unpublishable`` is why a publish of this key should not be
    tried now (the tier failed this call).
    """

    hit: Any = None
    download: Download | None = None
    why: str | None = None
    outcome: TierOutcome | None = None
    entry: RemoteEntry | None = None
    unpublishable: str | None = None


@dataclass
class Download:
    """A verified download the local cache did not take: its files, removed on :meth:`close`."""

    key: str
    directory: Path
    paths: dict[str, Path]
    entry: Any
    downloaded: int = 0
    #: Each file's digests as it arrived (with its identity then): see TierDownload.
    digests: dict[str, Digests] = field(default_factory=dict)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Download:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TieredCache:
    """A local :class:`BlobCache` and an optional shared tier, under one policy.

    Parameters
    ----------
    local : BlobCache
        The first level (its directory holds ``downloads/``, ``remote-pending/``).
    tier : RemoteTier or None
        The second level; None: the local cache alone.
    accept : callable
        ``accept(entry) -> str | None``: why a shared entry must not be served here.
    places : callable
        ``places(entry) -> [(file name, local key, metadata), ...]``: where each
        file of an accepted entry goes in the local cache, in that order.
    voice : Voice
        The caller's words for the tier's trouble.
    name : str
        How log lines name this cache (``"engine cache /path"``).
    """

    def __init__(self, local: BlobCache, tier: RemoteTier | None,
                 accept: Callable[[RemoteEntry], str | None], places: Places, *, voice: Voice,
                 name: str, logger: logging.Logger | None = None) -> None:
        from trtet_store.cache.tier.health import TierHealth

        self.local = local
        self.tier = tier
        self.accept = accept
        self.places = places
        self.voice = voice
        self.name = name
        self.log = logger or log
        self.health = TierHealth(self.log)
        #: Entries to replace at the next publish of their key (damaged, refused, not accepted).
        self.replace: dict[str, RemoteEntry] = {}
        self._errors: tuple[type[BaseException], ...] = tier_errors() if tier else ()

    @property
    def directory(self) -> Path:
        return self.local.directory

    # -- health ---------------------------------------------------------------------------

    def failed(self, what: str, key: str, exc: BaseException, *, said: str | None = None) -> str:
        """Say a tier failure (warned once until it works again); return its reason."""
        line, reason = self.voice.failed(what, key, exc, said)
        self.health.failed(line, cause=exc)
        return reason

    def worked(self) -> None:
        self.health.worked(self.voice.works())

    def lookup(self, key: str) -> RemoteEntry | None:
        """The tier's entry of ``key`` (the tier's errors raised)."""
        assert self.tier is not None
        return self.tier.lookup(key)

    # -- get --------------------------------------------------------------------------------

    def get(self, key: str, *, local: Callable[[], Any] | None = None,
            progress: Callable[[Any], Any] | None = None,
            no_room: Callable[[RemoteEntry, BaseException], None] | None = None) -> TierGet:
        """The local hit, else the tier's entry made one (see the module doc).

        ``local()`` is the caller's local lookup (default ``BlobCache.get(key)``);
        it is asked again once an entry was entered. Never raises the tier's
        errors (:data:`TIER_ERRORS`): they are said, and the result is a miss.
        """
        lookup = local or (lambda: self.local.get(key))
        hit = lookup()
        if hit is not None or self.tier is None:
            return TierGet(hit)
        try:
            entry = self.tier.lookup(key)
        except self._errors as exc:
            return TierGet(outcome=TierOutcome(key, "error", f"{type(exc).__name__}: {exc}"),
                           unpublishable=self.failed("lookup", key, exc))
        self.worked()
        if entry is None:
            return TierGet(outcome=TierOutcome(key, "miss", "not in the shared cache"))
        return self.take(key, entry, lookup, progress=progress, no_room=no_room)

    def refusal(self, key: str, entry: RemoteEntry) -> str | None:
        """Why ``entry`` is not served here (its signature first, then ``accept``), or None.

        A refused or not accepted entry is remembered to be replaced by this
        key's next publish; a refused one only when this cache signs (our own
        unsigned entry would be refused as well).
        """
        assert self.tier is not None
        refused = self.tier.signature_problem(entry)
        if refused is not None:  # an entry's problem, not the tier's: said each time
            self.health.notice(self.voice.refused(key, entry, refused))
            if self.tier.signing_key is not None:
                self.replace[key] = entry
            return f"refused: {refused}"
        problem = self.accept(entry)
        if problem is not None:
            self.log.warning("%s", self.voice.not_served(key, entry, problem))
            self.replace[key] = entry
        return problem

    def take(self, key: str, entry: RemoteEntry, local: Callable[[], Any], *,
             progress: Callable[[Any], Any] | None = None,
             no_room: Callable[[RemoteEntry, BaseException], None] | None = None) -> TierGet:
        """The tier's ``entry`` of ``key`` checked, downloaded, entered and looked up again.

        ``no_room(entry, exc)`` is called when the download is refused for
        space, before that is said (it may raise: no room for the build either).
        """
        from trtet_store.cache.tier import TierEntryError
        from trtet_store.io import InsufficientSpaceError

        assert self.tier is not None
        refused = self.refusal(key, entry)
        if refused is not None:
            why = None
            if refused.startswith("refused: ") and self.tier.signing_key is None:
                why = f"the shared entry is {refused.replace(': ', ' (', 1)}) and this " \
                      "cache has no signing key to replace it"
            return TierGet(outcome=TierOutcome(key, "miss", refused), entry=entry,
                           unpublishable=why)
        seen = _LastProgress(progress)
        directory = self.directory / DOWNLOADS / key
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            got = self.tier.download(entry, directory, progress=seen)
        except TierEntryError as exc:
            shutil.rmtree(directory, ignore_errors=True)
            self.replace[key] = entry
            self.health.notice(self.voice.damaged(key, exc))
            return TierGet(outcome=TierOutcome(key, "miss", f"damaged: {exc}"), entry=entry)
        except InsufficientSpaceError as exc:
            _keep_for_resume(directory)
            if no_room is not None:
                no_room(entry, exc)
            return TierGet(outcome=TierOutcome(key, "error", str(exc)), entry=entry,
                           unpublishable=self.failed("download", key, exc))
        except self._errors as exc:
            _keep_for_resume(directory)
            said = None
            if self.voice.download_failed is not None:
                said = self.voice.download_failed(key, exc, seen, directory)
            return TierGet(outcome=TierOutcome(key, "error", f"{type(exc).__name__}: {exc}"),
                           entry=entry, unpublishable=self.failed("download", key, exc,
                                                                  said=said))
        self.worked()
        outcome = TierOutcome(key, "hit", downloaded=got.downloaded)
        try:
            why, placement = self._place(key, entry, got.paths, got.digests)
        except OSError as exc:  # the local side of the hit (no room, ...): the tier's failure
            shutil.rmtree(directory, ignore_errors=True)
            return TierGet(outcome=TierOutcome(key, "error", f"{type(exc).__name__}: {exc}"),
                           entry=entry, unpublishable=self.failed("download", key, exc))
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        outcome.placement = placement
        if why is not None:
            # Still verified bytes: served once from the download (never thrown away for
            # a rebuild), removed when the caller closes it.
            self.log.warning("%s: the shared entry %s was downloaded (%d bytes) but not cached "
                             "here: %s; served from the download", self.name, key,
                             got.downloaded, why)
            return TierGet(download=Download(key, directory, dict(got.paths), entry,
                                             got.downloaded, dict(got.digests)),
                           why=why, outcome=outcome,
                           entry=entry)
        shutil.rmtree(directory, ignore_errors=True)  # linked into the cache: not kept
        hit = local()
        if hit is None:
            return TierGet(why="cached, then not found again (evicted at once?)",
                           outcome=outcome, entry=entry)
        self.log.info("%s: remote hit %s from %s (host %s): %d bytes downloaded", self.name,
                      key, self.tier.url, entry.host, got.downloaded)
        return TierGet(hit, outcome=outcome, entry=entry)

    def _place(self, key: str, entry: RemoteEntry, paths: dict[str, Path],
               digests: dict[str, Digests]) -> tuple[str | None, str | None]:
        """Each downloaded file into the local cache, in ``places``' order: (why not, how)."""
        placement = None
        for name, local_key, metadata in self.places(entry):
            # consume=True: downloads/ is on the cache's filesystem, so the put links the
            # file in (no second copy); a skipped put leaves the file where it is. With
            # the digests taken as the bytes arrived: the put reads nothing.
            result = self.local.put(local_key, paths[name], metadata, consume=True,
                                    digests=digests.get(name))
            if result.skipped:
                return f"{name}: {result.reason}", None
            placement = placement or result.placement
            said = self.voice.placed(name, key, result) if self.voice.placed else None
            if said is not None:
                self.log.info("%s", said)
        return None, placement

    # -- claim ------------------------------------------------------------------------------

    def claim(self, key: str, stack: contextlib.ExitStack, *, timeout: float | None,
              on_wait: Callable[[LeaseWait], Any] | None = None,
              ) -> tuple[RemoteEntry | None, str | None]:
        """The key's lease around a build: ``(entry published meanwhile, why not publishable)``.

        A lease taken is released by ``stack`` (after the build's publish,
        so waiters see the entry before the lease goes). Another machine's
        build that outlasts ``timeout`` is said, and this one builds too.
        ``on_wait`` gets a :class:`~trtet_store.cache.tier.LeaseWait` at each
        look at another holder's lease, and one with ``over=True`` when the
        wait ends, however it ends.
        """
        from trtet_store.cache.tier import Lease, LeaseWait, LeaseWaitTimeout

        assert self.tier is not None
        began = time.monotonic()
        last: list[dict[str, Any]] = []  # the holder's lease at the last look, once there is one

        def look(doc: dict[str, Any]) -> None:
            last[:] = [doc]
            if on_wait is not None:
                on_wait(LeaseWait.of(key, doc, time.monotonic() - began))

        try:
            try:
                got = self.tier.claim(key, timeout=timeout, on_wait=look)
            finally:  # the wait's line closes before anything about its end is said
                if last and on_wait is not None:
                    on_wait(LeaseWait.of(key, last[0], time.monotonic() - began, over=True))
        except LeaseWaitTimeout as exc:
            self.log.warning("%s: %s; building %s here (the first machine to publish it wins)",
                             self.name, exc, key)
            return None, None
        except self._errors as exc:
            return None, self.failed("claim", key, exc)
        if isinstance(got, Lease):
            stack.callback(self._release, got)
            return None, None
        return got, None

    def _release(self, lease: Any) -> None:
        try:
            if lease.lost:
                self.log.warning("%s: the lease on %s was taken over by another machine "
                                 "during the build", self.name, lease.key)
            lease.release()
        except self._errors as exc:  # it expires by itself
            self.log.warning("%s: the lease on %s was not released (%s: %s); it expires after "
                             "its ttl", self.name, lease.key, type(exc).__name__, exc)

    # -- publish ----------------------------------------------------------------------------

    def pending(self, key: str) -> bool:
        """Whether ``key`` is cached here and not yet in the shared tier."""
        return os.path.exists(self.directory / PENDING / key)

    def mark_pending(self, key: str) -> None:
        """Remember that ``key`` is cached here and not yet in the shared tier."""
        try:
            (self.directory / PENDING).mkdir(mode=0o700, exist_ok=True)
            (self.directory / PENDING / key).touch(mode=0o600)
        except OSError as exc:  # costs only the automatic retry of the publish
            self.log.debug("%s: cannot mark %s as not yet published: %s", self.name, key, exc)

    def push(self, key: str, files: Sequence[tuple[Any, ...]], metadata: dict[str, Any], *,
             progress: Callable[[Any], Any] | None = None) -> TierPublish:
        """Publish ``files`` under ``key`` (first writer wins); the tier's errors raised.

        A remembered entry of the key (damaged, refused, not accepted) is
        replaced (``If-Match`` that entry only).
        """
        assert self.tier is not None
        result = self.tier.publish(key, files, metadata, replace=self.replace.get(key),
                                   progress=progress)
        self.replace.pop(key, None)
        if result.published or result.entry is not None:  # the tier holds one: settled
            with contextlib.suppress(OSError):
                os.unlink(self.directory / PENDING / key)
        return result

    def publish(self, key: str, files: Sequence[tuple[Any, ...]], metadata: dict[str, Any]
                ) -> tuple[TierOutcome, TierPublish | None]:
        """:meth:`push` that never raises the tier's errors (said; ``"error"``)."""
        try:
            result = self.push(key, files, metadata)
        except self._errors as exc:
            reason = self.failed("publish", key, exc)
            return TierOutcome(key, "error", reason), None
        self.worked()
        if result.published:
            self.log.info("%s: %s published to %s (%d bytes sent)", self.name, key,
                          self.tier.url if self.tier else "", result.sent)
            return TierOutcome(key, "published", sent=result.sent), result
        self.log.info("%s: %s not published: %s; our entry is kept in the local cache",
                      self.name, key, result.reason)
        return TierOutcome(key, "not-published", result.reason or "not published",
                           sent=result.sent), result

    # -- pull -------------------------------------------------------------------------------

    def pull(self, key: str, entry: RemoteEntry, local: Callable[[], Any], *,
             progress: Callable[[Any], Any] | None = None) -> TierGet:
        """Download ``entry`` into the local cache; the tier's errors raised (nothing cached).

        The caller checked it first (:meth:`check`); ``download`` in the
        result is the verified files the local cache did not take.
        """
        from trtet_store.cache.tier import TierEntryError

        assert self.tier is not None
        directory = self.directory / DOWNLOADS / key
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            got = self.tier.download(entry, directory, progress=progress)
        except TierEntryError:
            shutil.rmtree(directory, ignore_errors=True)  # damaged: nothing to resume
            raise
        except BaseException:
            _keep_for_resume(directory)  # a cut pull resumes like a cut hit
            raise
        outcome = TierOutcome(key, "hit", downloaded=got.downloaded)
        try:
            why, outcome.placement = self._place(key, entry, got.paths, got.digests)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        if why is not None:
            return TierGet(why=why, outcome=outcome, entry=entry)
        hit = local()
        return TierGet(hit, why=None if hit is not None else
                       "cached, then not found again (evicted at once?)",
                       outcome=outcome, entry=entry)

    def check(self, key: str, entry: RemoteEntry) -> str | None:
        """For a pull: the signature (raises :class:`TierSignatureError`), then ``accept``."""
        assert self.tier is not None
        self.tier.check_signature(entry)
        return self.accept(entry)

    # -- this cache's id --------------------------------------------------------------------

    def origin(self) -> str:
        """This cache's id in the shared tier: random hex kept in ``<directory>/remote-origin``.

        Made once, atomically (a complete file linked into place: of two
        processes making it at once, both read the winner's). A cache that
        cannot keep it (read-only) gets a fresh one per process (logged).
        """
        return origin(self.directory, self.name, self.log)

    def adopt_tier(self, tier: RemoteTier) -> None:
        """Make ``tier`` (made by this cache from a URL) publish as this cache: origin, journals."""
        tier.origin = self.origin()
        tier.journal_dir = self.directory / REMOTE_JOURNAL


class _LastProgress:
    """A download's progress callback that keeps its last ``(done, total)`` and passes it on."""

    def __init__(self, then: Callable[[Any], Any] | None) -> None:
        self.then = then
        self.done: int | None = None
        self.total: int | None = None

    def __call__(self, update: Any) -> None:
        self.done, self.total = int(update.done), int(update.total)
        if self.then is not None:
            self.then(update)


def _is_origin(text: str) -> bool:
    return 8 <= len(text) <= 64 and all(c in "0123456789abcdef" for c in text)


def origin(directory: Path, name: str, logger: logging.Logger) -> str:
    """The origin id kept in ``directory``/remote-origin (see :meth:`TieredCache.origin`)."""
    path = directory / ORIGIN_FILE
    made = None
    for _ in range(2):
        try:
            text = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            text = None
        except (OSError, UnicodeDecodeError) as exc:
            logger.warning("%s: cannot read %s (%s); a new origin for this process",
                           name, path, exc)
            return uuid.uuid4().hex
        if text is not None and _is_origin(text):
            return text
        made = uuid.uuid4().hex
        try:
            # Complete, fsynced, and its directory entry durable (a killed publish resumes
            # under this id); linked only if absent: never replaces another process's
            # origin. A damaged file (not hex) is replaced, once.
            write_atomic(path, made.encode("ascii") + b"\n", replace=text is not None)
        except FileExistsError:
            continue  # read the winner's
        except OSError as exc:
            logger.warning("%s: cannot keep an origin id in %s (%s); a new one for this "
                           "process (its publishes will not resume)", name, path, exc)
            return made
        if text is not None:
            logger.warning("%s: %s held %r, not an origin id; replaced", name, path, text[:40])
        return made
    return made or uuid.uuid4().hex


def _keep_for_resume(directory: Path) -> None:
    """A cut download keeps what it staged (the next hit or pull resumes it); an empty
    directory (cut before anything was staged) is not left behind."""
    with contextlib.suppress(OSError):
        directory.rmdir()
