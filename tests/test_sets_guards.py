"""The sets' quieter guarantees, each set up as the state its check exists for.

- A store blob written in place with its mtime put back (``os.utime``) is
  not trusted by its seal (the identity holds the ctime): refused, nothing placed.
- A blob a bucket writer replaced (with a consistent blob manifest) is
  refused from HeadObject's size before its body is asked for: bytes
  counted through the counting proxy.
- A link planted at a member's file name in the destination is replaced,
  never written through.
- The clean-up and the prune delete a blob only at the ETag they listed:
  a blob re-uploaded between the listing and the delete survives.

Real SeaweedFS, real ext4 loop mounts, a real second uid for the planted links.
"""

from __future__ import annotations

import os
import stat

import pytest
import xxhash
from attacker import as_nobody, shared_dir, tree
from sets_helpers import write

from trtet_store.io import MiB, VerificationError
from trtet_store.remote.errors import FetchVerificationError
from trtet_store.remote.s3 import S3
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.remote.upload.send import publish_blob
from trtet_store.remote.upload.source import ObjectSource
from trtet_store.remote.url import RemoteURL
from trtet_store.sets import fetch_set, publish_set, verify_member
from trtet_store.sets.manifest import blob_key
from trtet_store.testing.proxy import CountingProxy

FOUNDATION = MiB + 4099
OWN = 64 * 1024 + 7


def xxh(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


@pytest.fixture
def pair(s3env, here_fs):
    """Two members (a lora.pte each) sharing one foundation.ptd."""
    shared = write(here_fs / "src" / "foundation.ptd", FOUNDATION, 6100)
    members = {n: [write(here_fs / "src" / n / "lora.pte", OWN, 6110 + i), shared]
               for i, n in enumerate("ab")}
    url = f"s3://{s3env.bucket}/g/v1/"
    publish_set(members, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    return url, shared.read_bytes(), members


def test_a_store_blob_rewritten_with_its_mtime_put_back_is_refused(s3env, pair, make_fs):
    url, foundation, _ = pair
    mnt = make_fs("ext4", 64)
    store = mnt / "store"
    fetch_set(url, mnt / "a", "a", store=store, placements=["clone", "copy"],
              endpoint_url=s3env.endpoint.url)
    blob = store / xxh(foundation)
    st = os.lstat(blob)
    with open(blob, "r+b") as f:  # root writes the 0444 blob in place: same size
        f.write(b"\xee" * 4096)
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))  # its mtime put back
    now = os.lstat(blob)
    assert (now.st_size, now.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    with pytest.raises(VerificationError, match="remove it and fetch again"):
        fetch_set(url, mnt / "b", "b", store=store, placements=["clone", "copy"],
                  endpoint_url=s3env.endpoint.url)
    assert not (mnt / "b" / "foundation.ptd").exists()
    assert not (mnt / "b" / "lora.pte").exists()
    assert verify_member(mnt / "a").ok  # a's own copy untouched


def test_a_replaced_blob_is_refused_before_its_body_is_downloaded(s3env, here_fs, tmp_path):
    big = write(here_fs / "src" / "big.ptd", 6 * MiB, 6200)
    pte = write(here_fs / "src" / "m.pte", 5000, 6201)
    url = f"s3://{s3env.bucket}/h/"
    publish_set({"m": [pte, big]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    # A bucket writer replaces the blob with other bytes, its blob manifest made to match.
    digest = xxh(big.read_bytes())
    other = write(here_fs / "other" / digest, 7 * MiB, 6202)
    publish_blob(ObjectSource.of_file(other, digest),
                 RemoteURL(s3env.bucket, blob_key("h/", digest)), client=S3(s3env.endpoint.url),
                 config=PublishConfig(journal_dir=tmp_path / "writer"), resume=False)
    dest = here_fs / "dest"
    with CountingProxy.for_url(s3env.endpoint.url) as px, \
            pytest.raises(FetchVerificationError, match="the server holds") as err:
        fetch_set(url, dest, "m", store=here_fs / "store", endpoint_url=px.endpoint_url)
    assert "\n" not in str(err.value)
    assert px.downstream < MiB, px.counts()  # the manifests and a HEAD, no blob body
    assert not (dest / "big.ptd").exists() and not (dest / "m.pte").exists()
    assert not (here_fs / "store" / digest).exists()


@pytest.mark.parametrize("link", [False, True])
def test_a_link_planted_at_a_members_name_is_replaced_not_written_through(
        s3env, pair, make_fs, link):
    url, foundation, members = pair
    mnt = make_fs("ext4", 64)
    os.chmod(mnt, 0o755)
    shared = shared_dir(mnt)
    home = mnt / "root-only"
    home.mkdir(mode=0o700)
    victims = {"lora.pte": write(home / "victim.pte", OWN, 1),
               "foundation.ptd": write(home / "victim.ptd", FOUNDATION, 2)}
    for v in victims.values():
        os.chmod(v, 0o600)

    def plant() -> None:
        for name, target in victims.items():
            os.symlink(target, shared / name)

    as_nobody(plant)
    before = tree(home)
    fetch_set(url, shared, "a", store=mnt / "store", link=link,
              endpoint_url=s3env.endpoint.url)
    assert tree(home) == before
    for v in victims.values():
        st = os.lstat(v)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    for name in victims:
        st = os.lstat(shared / name)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0, name
    assert (shared / "lora.pte").read_bytes() == members["a"][0].read_bytes()
    assert (shared / "foundation.ptd").read_bytes() == foundation


class _Racing(S3):
    """A client whose delete of one blob object lets another publisher re-upload it first:
    the barrier between the clean-up's (or prune's) listing and its delete."""

    def __init__(self, endpoint: str, boto, key: str) -> None:
        super().__init__(endpoint)
        self.boto, self.key, self.raced = boto, key, []

    def delete(self, bucket: str, key: str, if_match: str | None = None) -> None:
        if key == self.key and not self.raced:
            put = self.boto.put_object(Bucket=bucket, Key=key, Body=b"re-uploaded" * 100)
            self.raced.append(put["ETag"].strip('"'))
        super().delete(bucket, key, if_match=if_match)


def test_the_clean_up_never_deletes_a_blob_re_uploaded_after_its_listing(s3env, here_fs):
    pte = write(here_fs / "s" / "m.pte", 5000, 1)
    old = write(here_fs / "s" / "w.ptd", 70_000, 2)
    url = f"s3://{s3env.bucket}/c/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    publish_set({"m": [pte, old]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    key = blob_key("c/", xxh(old.read_bytes()))
    write(old, 70_000, 3)  # v2 names other bytes: v1's w.ptd blob is the clean-up's
    client = _Racing(s3env.endpoint.url, s3env.client, key)
    rep = publish_set({"m": [pte, old]}, url, client=client, config=cfg,
                      if_exists="replace")
    assert client.raced, "the clean-up never reached the blob's delete"
    head = s3env.client.head_object(Bucket=s3env.bucket, Key=key)
    assert head["ETag"].strip('"') == client.raced[0]  # the re-upload survived
    assert rep.removed == []


def test_the_prune_never_deletes_a_blob_re_uploaded_after_its_listing(s3env, here_fs):
    pte = write(here_fs / "s" / "m.pte", 5000, 1)
    url = f"s3://{s3env.bucket}/p/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    publish_set({"m": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    key = blob_key("p/", "ab" * 16)  # a killed publisher's blob, named by no manifest
    s3env.client.put_object(Bucket=s3env.bucket, Key=key, Body=b"left behind" * 100)
    client = _Racing(s3env.endpoint.url, s3env.client, key)
    rep = publish_set({"m": [pte]}, url, client=client, config=cfg, if_exists="replace",
                      gc_grace=0)
    assert client.raced, "the prune never reached the blob's delete"
    head = s3env.client.head_object(Bucket=s3env.bucket, Key=key)
    assert head["ETag"].strip('"') == client.raced[0]
    assert rep.pruned == []

