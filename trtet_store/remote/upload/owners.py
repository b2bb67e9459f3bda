"""Which program owns a key: read from the manifests beside it (the publish's neighbours).

ExecuTorch names ``.ptd`` files by tag (``cpu.ptd``), not by program, so two
programs published side by side under one prefix would share keys. Objects
stay beside their program (that is where the runtime and ``fetch`` look for
them); a key that another program's manifest names (or that is another
program's manifest) is that program's, and no publish replaces or removes
it, ``--replace`` or not (:class:`~trtet_store.remote.errors.OwnedByOtherProgramError`).
"""

from __future__ import annotations

import logging
import posixpath

from trtet_store.remote.errors import ManifestError, OwnedByOtherProgramError, RemoteError
from trtet_store.remote.manifest import Manifest, manifest_key, named_keys, program_key_of
from trtet_store.remote.s3 import S3
from trtet_store.remote.sweep import Listed, SweepPlan, plan_sweep
from trtet_store.remote.url import RemoteURL

# The publish's logger, as before these rules left send.py.
log = logging.getLogger("trtet_store.remote")


def owners_of(s3: S3, bucket: str, key: str, mkey: str) -> dict[str, str]:
    """``{object key: owning program's key}`` from every other manifest beside ``key``.

    Our own manifest (``mkey``) is left out: what it names is ours to
    replace. A manifest names keys in its own directory (the publisher puts
    every object beside its program), so one listing of that directory finds
    every program that could own a key we write. Each manifest is read
    leniently (:func:`~trtet_store.remote.manifest.named_keys`), so one of a
    later format still protects its objects; one that cannot be read at all
    protects only itself, with a warning.
    """
    head = posixpath.dirname(key)
    owners: dict[str, str] = {}
    for k in s3.list_keys(bucket, f"{head}/" if head else ""):
        program = program_key_of(k)
        if program is None or k == mkey:
            continue
        owners[k] = program
        try:
            got = s3.get(bucket, k)
            if got is None:  # removed since the listing
                continue
            named = named_keys(got[0])
        except (ManifestError, RemoteError) as exc:
            log.warning("s3://%s/%s cannot be read (%s); the objects it names are not known "
                        "to this publish", bucket, k, exc)
            continue
        for n in named:
            owners.setdefault(n, program)
    return owners


def owned_error(bucket: str, dest: RemoteURL, owned: list[str],
                 owners: dict[str, str]) -> OwnedByOtherProgramError:
    """The refusal of a publish to ``dest`` that would replace ``owned``, naming each owner."""
    stem = posixpath.splitext(dest.name)[0] or dest.name
    alone = dest.sibling(stem) + "/" + dest.name
    which = "; ".join(f"{posixpath.basename(k)} belongs to s3://{bucket}/{owners[k]}"
                      for k in owned)
    return OwnedByOtherProgramError(
        f"publishing s3://{bucket}/{dest.key} would replace another program's object: "
        f"{which} (its manifest names it). A publish never replaces another program's "
        "objects, with or without --replace; publish this program under a prefix of its "
        f"own, e.g. s3://{bucket}/{alone}", owned[0], f"s3://{bucket}/{owners[owned[0]]}")


def remove_replaced(s3: S3, bucket: str, key: str, mkey: str, previous: dict[str, str],
                    kept: set[str]) -> list[str]:
    """Remove the replaced version's objects that the new manifest no longer names.

    Runs after the new manifest is committed and checked. An object goes
    only when it is beside the program, no other program's manifest names
    it (listed again now), and it still has the ETag the replaced manifest
    named (a conditional DeleteObject: a version written since is someone's
    and stays). Best effort: the publish is done; what cannot be removed is
    named in a warning and stays.
    """
    plan = replaced_plan(s3, bucket, key, mkey, previous, kept)
    removed = [] if plan is None else plan.execute(s3, bucket)
    for k in removed:
        log.info("removed s3://%s/%s: the replaced version had it, no manifest names it now",
                 bucket, k)
    return removed


def replaced_plan(s3: S3, bucket: str, key: str, mkey: str, previous: dict[str, str],
                  kept: set[str]) -> SweepPlan | None:
    """The sweep of :func:`remove_replaced` (a dry run's plan); None: nothing is removed
    (the other programs' manifests could not be listed)."""
    gone = sorted(k for k in previous if k not in kept)
    if not gone:
        return SweepPlan()
    where = posixpath.dirname(key)
    try:
        owners = owners_of(s3, bucket, key, mkey)
    except (RemoteError, OSError) as exc:
        log.warning("the replaced version's objects %s are kept: the other programs' "
                    "manifests could not be listed (%s)", ", ".join(gone), exc)
        return None
    beside = [k for k in gone if posixpath.dirname(k) == where and program_key_of(k) is None]
    for k in sorted(set(gone) - set(beside)):
        log.warning("s3://%s/%s is kept: the replaced manifest named it, but it is not "
                    "an object beside the program", bucket, k)
    named = {k: f"s3://{bucket}/{owners[k]} names it too" for k in beside if k in owners}
    # No grace: the replaced manifest's ETag is the version judged.
    return plan_sweep([Listed(k, previous[k]) for k in beside], named, 0)


def replace_dry_run(names: list[str], url: str, *, endpoint_url: str | None = None
                    ) -> tuple[SweepPlan | None, list[str]]:
    """What a ``--replace`` publish of files named ``names`` (the program's first) to ``url``
    would remove, read from the manifest there now: ``(plan, the new version's keys)``.
    Nothing is written."""
    dest = RemoteURL.parse(url)
    keys = [dest.key] + [dest.sibling(n) for n in names[1:]]
    s3 = S3(endpoint_url)
    mkey = manifest_key(dest.key)
    got = s3.get(dest.bucket, mkey)
    previous = {} if got is None else {e.key: e.etag for e in Manifest.from_json(got[0]).objects}
    return replaced_plan(s3, dest.bucket, dest.key, mkey, previous, set(keys)), keys
