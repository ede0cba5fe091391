"""unnamed(): a front end's own JSON with who is connected, and from where, left out."""

from __future__ import annotations

from fqbroker.frontends.http.stats.frontends import HIDDEN, unnamed


def test_keyed_names_blank_and_their_words_hidden_elsewhere() -> None:
    section = {
        "sequence": 7,
        "subscribers": [{"remote": "10.0.0.7:4000", "journaling": True, "expires_in": 3.5}],
    }
    panel = {
        "id": "fyrehose",
        "chips": {
            "field": "subscribers",
            "items": [
                {
                    "text": "10.0.0.7:4000 · journal",
                    "title": ["10.0.0.7:4000: journal, for ", {"n": 3.5, "f": "fixed1"}],
                    "data": {"remote": "10.0.0.7:4000", "journaling": "true"},
                }
            ],
        },
    }
    assert unnamed(section) == {
        "sequence": 7,
        "subscribers": [{"remote": "", "journaling": True, "expires_in": 3.5}],
    }
    (chip,) = unnamed(panel)["chips"]["items"]
    assert chip == {
        "text": f"{HIDDEN} · journal",
        "title": [f"{HIDDEN}: journal, for ", {"n": 3.5, "f": "fixed1"}],
        "data": {"remote": "", "journaling": "true"},
    }


def test_addresses_known_from_elsewhere_are_hidden_too() -> None:
    """A panel need not say which of its words is an address: the connections' and the
    other documents' addresses are passed in."""
    panel = {"tiles": [{"label": "last", "value": {"text": "from [::1]:5000 and 10.1.2.3:9"}}]}
    known = ["[::1]:5000", "10.1.2.3:9"]
    assert unnamed(panel, known)["tiles"][0]["value"]["text"] == f"from {HIDDEN} and {HIDDEN}"


def test_user_names_are_hidden_where_they_stand_alone() -> None:
    doc = {"rows": [{"user": "carol", "queue": "carol-q"}, {"owner": "carol"}]}
    # A name is a whole value: "carol-q" is a queue, and stays.
    assert unnamed(doc) == {"rows": [{"user": "", "queue": "carol-q"}, {"owner": HIDDEN}]}
