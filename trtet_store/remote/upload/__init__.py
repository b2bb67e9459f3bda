"""The upload half: a program or files into multipart uploads, committed by a manifest.

:mod:`.program` (``publish``: a program or files as object sources) over
:mod:`.send` (the publish's steps: plan, send, complete, the manifest last),
with :mod:`.plan` (each object's plan, a resume, server-side copies),
:mod:`.transfer` (parts read, sent and copied), :mod:`.owners` (which
program owns a key), :mod:`.parts` (part sizes), :mod:`.delta` (parts
copied server-side), :mod:`.index` (the engine-digest index),
:mod:`.journal` (the resume record) and :mod:`.source` (the bytes sent);
:mod:`.unfinished` lists and aborts the uploads a publish left open.
Never imports :mod:`trtet_store.remote.download`.
"""
