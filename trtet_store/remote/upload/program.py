"""``publish(source, url)``: a program or files made into objects (the one export/ import).

A source is an ExecuTorch program (``ExecutorchProgramManager``: its
``.pte`` and every ``.ptd``, the pieces ``save_program`` would write, from
:func:`trtet_store.export.executorch.program_layouts`, loaded lazily) or
local files (the first is the program, the rest go beside it under their
own names).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtet_store.io import PUBLISH_STAGING_DIR, UNSET, staging_directory
from trtet_store.remote.filenames import check_program_names
from trtet_store.remote.keyconfig import resolve_signing
from trtet_store.remote.report import PublishProgress, PublishReport
from trtet_store.remote.upload.config import PublishConfig, config_of, replace_of
from trtet_store.remote.upload.send import publish_sources
from trtet_store.remote.upload.source import ObjectSource
from trtet_store.remote.url import RemoteURL


def sources_of(source: Any, url: RemoteURL) -> list[ObjectSource]:
    """The objects ``source`` stands for, the program first, named as they will be published.

    Raises
    ------
    FileNameError
        A name outside a program's closed set (:mod:`trtet_store.remote.filenames`:
        the program's own name, and plain ``.ptd`` names), before anything is read
        or sent.
    """
    where = f"publish s3://{url.bucket}/{url.key}"
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    if isinstance(source, (list, tuple)) and source and all(
            isinstance(s, (str, os.PathLike)) for s in source):
        files = [Path(s) for s in source]
        check_program_names([url.name, *(f.name for f in files[1:])], where)
        objs = [ObjectSource.of_file(files[0], url.name)]
        objs += [ObjectSource.of_file(f) for f in files[1:]]
        return objs
    if isinstance(source, (list, tuple)):
        raise TypeError("a list source must name local files (str or path-like)")
    from trtet_store.export.executorch import program_layouts  # heavy: ExecuTorch

    layouts = program_layouts(source, url.name, consume=False)
    names = [url.name if i == 0 else Path(path).name for i, (path, _) in enumerate(layouts)]
    check_program_names(names, where)
    return [ObjectSource(name, list(pieces))
            for name, (_, pieces) in zip(names, layouts, strict=True)]


def publish(
    source: Any,
    url: str,
    *,
    endpoint_url: str | None = None,
    config: PublishConfig | None = None,
    replace: bool = UNSET,
    if_exists: str = UNSET,
    resume: bool = True,
    progress: Callable[[PublishProgress], Any] | None = None,
    part_size: int | None = UNSET,
    concurrency: int = UNSET,
    journal_dir: os.PathLike | str | None = UNSET,
    index: bool = UNSET,
    signing_key: Any = None,
) -> PublishReport:
    """Publish a program (or local files) to S3-compatible storage, from its pieces.

    The objects are streamed from the pieces (staged engines read in place,
    no local output file), in multipart uploads of equal-size parts sent in
    parallel, each part with its CRC64NVME; each object is completed with its
    full-object CRC64NVME and a conditional write, and checked with
    HeadObject; a manifest (``<key>.trtet.json``) is written last and commits
    the set. An interrupted publish is resumed from its journal; a
    re-publish copies unchanged ranges server-side.

    Parameters
    ----------
    source : ExecutorchProgramManager, path-like, or sequence of path-like
        The program (its ``.pte`` and every ``.ptd``, the bytes
        ``save_program`` writes), or local files (the first is the program;
        the others are published beside it under their own names).
    url : str
        ``s3://bucket/prefix/model.pte``. The ``.ptd`` files go beside it.
    endpoint_url : str, optional
        The S3-compatible server; default what boto3 finds
        (``AWS_ENDPOINT_URL``, the profile). Credentials are found the way
        boto3 finds them.
    config : PublishConfig, optional
        How the objects are sent: ``part_size``, ``concurrency``,
        ``journal_dir``, ``index`` (see :class:`PublishConfig`), handed down
        unchanged. Those four keywords still work (for one release); one
        given beside ``config`` with another value is a ``TypeError``.
    replace : bool
        The older spelling of ``if_exists``: ``replace=True`` is
        ``if_exists="replace"``; given with an ``if_exists`` that disagrees
        it is a ``TypeError``.
    if_exists : {"error", "replace"}
        When the program's key exists: ``"error"`` (default) raises
        :class:`KeyExistsError`; ``"replace"`` replaces it (Complete with
        ``If-Match`` of the version found). After the new manifest commits,
        the replaced version's objects it no longer names are deleted (not
        those another program's manifest names, nor those changed since).
        Never replaces another program's objects. Another value is a
        ``ValueError`` naming the choices.
    resume : bool
        Resume an interrupted publish of the same pieces to the same place
        (default); False aborts its uploads and starts over.
    progress : callable, optional
        Called with a :class:`PublishProgress` (``done``, ``total``,
        ``sent``, ``copied``, ``resumed`` bytes) as parts finish, from worker
        threads.
    part_size, concurrency, journal_dir, index
        The fields of ``config`` as keywords (kept for one release).
    signing_key : path-like or SigningKey, optional
        Sign the manifest (a signed root, as a set's): every object, and
        every chunk of each piece, named by sha256 too (taken in the pass
        that reads the bytes for their xxh3 and CRC), and an ed25519
        signature over all of it; ``fetch(trusted_keys=...)`` checks it.
        Default ``TRTET_SIGNING_KEY``, else the config file's, else unsigned.

    Returns
    -------
    PublishReport

    Raises
    ------
    RemoteURLError, PartSizeError, TypeError, ValueError
        Bad arguments; nothing was sent.
    FileNameError
        A file name no program may have: the program's files are its own
        name and plain ``.ptd`` names (no leading dot, no path, no control
        character, none of trtet_store's own names); nothing was sent.
    BucketNotFoundError, AccessDeniedError
        Before anything was created.
    OwnedByOtherProgramError
        A key is named by another program's manifest beside it (two
        programs' ``cpu.ptd``), or is another program's manifest; refused
        whatever ``replace`` says, naming the owner. Publish under a prefix
        of its own. Nothing was created.
    KeyExistsError
        The key (or its manifest) exists and ``replace`` is False.
    SourceChangedError
        A staged piece is not as sealed (before anything is sent), or changed
        while it was read (the uploads are aborted).
    ConflictError
        Another writer created or changed the key (or committed the
        program's manifest) after this publish planned; our uploads are
        aborted, and the other writer's version is kept.
    UploadKeptError, ChecksumMismatchError
        The network or the server's checksum checks failed past the retries;
        the upload and its journal are kept: publish again to resume.
    """
    # Checked before the source is read (a program's layouts load ExecuTorch).
    cfg = config_of(config, "publish", part_size=part_size, concurrency=concurrency,
                    journal_dir=journal_dir, index=index)
    replace = replace_of(replace, if_exists, "publish")
    dest = RemoteURL.parse(url)
    key = resolve_signing(signing_key)  # a key that cannot be used: refused before a read
    return publish_sources(sources_of(source, dest), dest, endpoint_url=endpoint_url,
                           config=cfg, replace=replace, resume=resume, progress=progress,
                           signing_key=key)


#: Where :func:`compile_and_publish` stages its engines, under its ``store`` directory.
PUBLISH_STAGING = PUBLISH_STAGING_DIR


def publish_staging(store: os.PathLike | str | None = None) -> Path:
    """The directory :func:`compile_and_publish` stages engines in (and keeps them in on failure).

    Parameters
    ----------
    store : path-like, optional
        The directory it goes under; default the current directory.

    Returns
    -------
    Path
        ``store / ".trtet-publish-staging"``.
    """
    return (Path(store) if store is not None else Path.cwd()) / PUBLISH_STAGING


def compile_and_publish(
    source: Any,
    inputs: tuple | None,
    url: str,
    *,
    store: os.PathLike | str | None = None,
    lowering: Any = None,
    backend_config: Any = None,
    segment_alignment: int | None = None,
    endpoint_url: str | None = None,
    replace: bool = False,
    journal_dir: os.PathLike | str | None = None,
    progress: Callable[[PublishProgress], Any] | None = None,
    signing_key: Any = None,
    **keywords: Any,
) -> PublishReport:
    """Lower ``source``, ``to_executorch`` it and publish it, writing no local program file.

    The program manager goes to :func:`publish` as it is: the objects are
    streamed from its pieces, the bytes ``save_program`` would write. The
    TensorRT engines are staged in :func:`publish_staging` under ``store``:
    released once published (the directory is then removed when empty), and
    KEPT there when anything after the build fails (a dropped link must not
    cost hours of builds): the next call with the same build takes them
    instead of building again.

    Parameters
    ----------
    source : torch.nn.Module, ExportedProgram, or dict of them
        What ``trtet_store.export_program`` lowers.
    inputs : tuple, optional
        The example inputs (None: ``source`` carries them, as several methods do).
    url : str
        ``s3://bucket/prefix/model.pte``; the ``.ptd`` files go beside it.
    store : path-like, optional
        The directory the staging directory goes under (default: the current directory).
    lowering : LoweringOptions, optional
        How ``source`` is lowered, as ``compile_and_save`` takes it (its backend:
        ``"tensorrt"``, segments page-aligned unless set, or ``"xnnpack"``; its
        ``external_engine_data``/``external_weights``: engines, xnnpack weights, or
        what TensorRT leaves to other partitioners in ``NAME.ptd`` beside the
        program). Its fields are still accepted as keywords (``backend=``), and
        Torch-TensorRT compile settings too, as ``compile_and_save`` accepts them.
    backend_config : ExecutorchBackendConfig, optional
        ``to_executorch``'s config, as ``compile_and_save`` takes it (not changed).
    segment_alignment : int, optional
        An explicit segment alignment, a power of two.
    endpoint_url, replace, journal_dir, progress, signing_key
        As :func:`publish` (``signing_key``: the manifest signed, a signed root; the
        default is ``TRTET_SIGNING_KEY``, else the config file's, else unsigned).

    Returns
    -------
    PublishReport

    Raises
    ------
    TypeError
        A keyword neither this function, the lowering options nor the TensorRT
        compiler knows, or one given beside ``lowering`` with another value:
        before anything is made.
    Exception
        Whatever the export or :func:`publish` raises; the engines built so
        far stay in ``publish_staging(store)``.
    """
    import contextlib
    import inspect

    # The one lazy export/ import of remote: ExecuTorch and torch load only here.
    from trtet_store.export.compile import executorch_config
    from trtet_store.export.lowering import export as export_program
    from trtet_store.export.options import lowering_of
    from trtet_store.io import BlobStore

    lowering, settings = lowering_of(lowering, "compile_and_publish", keywords,
                                     inspect.signature(compile_and_publish).parameters)
    # The same to_executorch config compile_and_save uses, so the objects equal
    # the files compile_and_save would write.
    config = executorch_config(backend_config, lowering.backend, segment_alignment)
    directory = publish_staging(store)
    # Before the build: a link, another user's directory, or one writable by
    # others is refused, and nothing is written in it.
    staging_directory(directory).close()
    with BlobStore(directory) as blobs:
        edge = export_program(source, inputs=inputs, store=blobs, lowering=lowering,
                              **settings)
        program = edge.to_executorch(config)
        try:
            report = publish(program, url, endpoint_url=endpoint_url, replace=replace,
                             journal_dir=journal_dir, progress=progress,
                             signing_key=signing_key)
        except BaseException:
            # The engines (and their build records) stay as orphans of the directory:
            # the next run of the same build takes them instead of building again.
            for blob in blobs.blobs():
                blob.keep()
            raise
    with contextlib.suppress(OSError):
        directory.rmdir()  # empty once every engine is released
    return report


__all__ = ["PUBLISH_STAGING", "PublishConfig", "PublishProgress", "PublishReport",
           "compile_and_publish",
           "publish", "publish_staging", "sources_of"]
