"""SigV4 credentials: a secret derived from the server key (never stored), the key kept 0600."""

from __future__ import annotations

import os
import re
import stat

import pytest

from orchestrator.sagemaker_api import sigv4
from orchestrator.sagemaker_api.errors import AwsError


def test_access_key_ids_look_like_aws_ones_and_secrets_derive_from_the_server_key():
    ids = {sigv4.new_access_key_id() for _ in range(50)}
    assert len(ids) == 50 and all(sigv4.is_access_key_id(i) for i in ids)
    assert not sigv4.is_access_key_id("AKIA123") and not sigv4.is_access_key_id("ASIA" + "A" * 16)
    key_id = next(iter(ids))
    secret = sigv4.derive_secret(b"k" * 32, key_id)
    assert re.fullmatch(r"[A-Za-z0-9+/]{40}", secret)
    assert sigv4.derive_secret(b"k" * 32, key_id) == secret  # recomputable by any replica with the key
    assert sigv4.derive_secret(b"j" * 32, key_id) != secret  # a new server key voids every secret
    assert sigv4.derive_secret(b"k" * 32, sigv4.new_access_key_id()) != secret


def test_the_server_key_is_made_once_private_or_taken_from_the_environment(tmp_path):
    path = tmp_path / "sigv4.key"
    key = sigv4.load_server_key(None, path)
    assert len(key) == 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sigv4.load_server_key(None, path) == key
    assert sigv4.load_server_key("ab" * 16, path) == bytes.fromhex("ab" * 16)
    for bad in ("not hex", "abcd"):
        with pytest.raises(ValueError, match="AERIE_SIGV4_KEY"):
            sigv4.load_server_key(bad, path)


def test_the_authorization_header_is_parsed_or_refused_with_aws_codes():
    auth = sigv4.parse_authorization(
        "AWS4-HMAC-SHA256 Credential=AKIAAAAAAAAAAAAAAAAA/20261123/eu-west-1/sagemaker/aws4_request, "
        "SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=abc123"
    )
    assert (auth.access_key_id, auth.date, auth.region, auth.service) == (
        "AKIAAAAAAAAAAAAAAAAA",
        "20261123",
        "eu-west-1",
        "sagemaker",
    )
    assert auth.signed_headers == ("content-type", "host", "x-amz-date", "x-amz-target")
    cases = {
        None: "MissingAuthenticationTokenException",
        "": "MissingAuthenticationTokenException",
        "Bearer aer_adm_x": "IncompleteSignatureException",
        "AWS4-HMAC-SHA256 Credential=A/b/c/d/aws4_request": "IncompleteSignatureException",
        "AWS4-HMAC-SHA256 Credential=A/b, SignedHeaders=host, Signature=x": "IncompleteSignatureException",
    }
    for header, code in cases.items():
        with pytest.raises(AwsError) as err:
            sigv4.parse_authorization(header)
        assert err.value.code == code
