"""The queue field's parameters and the canonical form stored in sqlite: the reject
policy beside fq's drop and block."""

from __future__ import annotations

import pytest

from fqbroker.core.queuespec import Policy, parse_queue_field
from fqbroker.errors import AuthError


@pytest.mark.parametrize(
    ("field", "policy", "attributes"),
    [
        (b"q\0mem:drop", Policy.DROP, "private,drop,backlog=16384"),
        (b"q\0mem:block", Policy.BLOCK, "private,block,backlog=16384"),
        (b"q\0mem:reject", Policy.REJECT, "private,reject,backlog=16384"),
        (b"q\0disk:public,reject,backlog=-1", Policy.REJECT, "public,reject,backlog=-1"),
        (b"q\0mem:reject,drop", Policy.DROP, "private,drop,backlog=16384"),  # the last wins
    ],
)
def test_policies_parse_and_print(field: bytes, policy: Policy, attributes: str) -> None:
    spec = parse_queue_field(field)
    assert (spec.effective_policy, spec.attributes) == (policy, attributes)
    # What sqlite keeps reads back the same (storage/configdb/state.py parses it so).
    kind = field.split(b"\0")[1].split(b":")[0]
    again = parse_queue_field(b"q\0" + kind + b":" + spec.attributes.encode())
    assert again.attributes == attributes


@pytest.mark.parametrize("word", ["refuse", "Reject", "reject-publish", "rejects"])
def test_an_unknown_policy_word_is_refused(word: str) -> None:
    with pytest.raises(AuthError, match=f"invalid queue param: {word}"):
        parse_queue_field(b"q\0mem:" + word.encode())
