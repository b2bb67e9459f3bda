"""``RemoteURL.parse_prefix``: a set's ``s3://bucket/prefix/`` (issue 47), refused early."""

from __future__ import annotations

import pytest

from trtet_store.remote.errors import RemoteURLError
from trtet_store.remote.url import RemoteURL
from trtet_store.sets.publish import parse_set_url


@pytest.mark.parametrize("url, want", [
    ("s3://bkt/llm/v3/", ("bkt", "llm/v3/")),
    ("s3://bkt/llm/v3", ("bkt", "llm/v3/")),
    ("s3://bkt/llm/v3//", ("bkt", "llm/v3/")),
    ("s3://bkt/", ("bkt", "")),
    ("s3://bkt", ("bkt", "")),
])
def test_a_prefix_ends_in_one_slash_or_is_the_root(url, want):
    assert RemoteURL.parse_prefix(url) == want == parse_set_url(url)


@pytest.mark.parametrize("url, why", [
    ("s3://bkt/a//b/", "empty, '.' or '..' segment"),
    ("s3://bkt/../x/", "empty, '.' or '..' segment"),
    ("s3://bkt/a/./", "empty, '.' or '..' segment"),
    ("s3://bkt/a\0/", "empty, '.' or '..' segment"),
    ("s3://b/x/", "is not a bucket name"),
    ("https://bkt/x/", "expected s3://bucket/prefix/"),
])
def test_a_bad_prefix_is_refused_naming_the_url_given(url, why):
    with pytest.raises(RemoteURLError, match=why) as info:
        RemoteURL.parse_prefix(url)
    assert str(info.value).startswith(repr(url))


def test_a_prefix_must_be_a_str():
    with pytest.raises(TypeError, match="must be a str"):
        RemoteURL.parse_prefix(b"s3://bkt/x/")
