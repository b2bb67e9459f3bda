"""What "the shared tier failed" means: the one error set the tier raises and the policy catches.

:class:`~trtet_store.remote.errors.RemoteError` is every refusal of the
object store (unreachable, credentials, bucket, a condition, a damaged
entry) and :class:`OSError` every failure of the local side of a transfer
(no room to download, a journal that cannot be written). The two-level
policy (:class:`trtet_store.cache.tiered.TieredCache`) turns exactly these
into a warning and the local cache alone; anything else is a bug and is
raised.
"""

from __future__ import annotations

from trtet_store.remote.errors import RemoteError

#: The tier's failures, caught by the policy (``except TIER_ERRORS``).
TIER_ERRORS: tuple[type[BaseException], ...] = (RemoteError, OSError)


def public_name(exc: BaseException) -> str:
    """The name of ``exc``'s public class (EndpointUnreachableError, AccessDeniedError...),
    not a transport's internal subclass."""
    return next((c.__name__ for c in type(exc).__mro__
                 if c.__module__ == RemoteError.__module__), type(exc).__name__)


__all__ = ["TIER_ERRORS", "public_name"]
