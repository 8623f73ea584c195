"""E2B's network options checked as E2B checks them (`activator._network`), one table per option."""

from __future__ import annotations

import pytest

from activator._errors import InvalidRequest
from activator._network import (
    DOMAINS_NEED_ALL_TRAFFIC,
    MAX_HTTPS_PORTS,
    check_private_ingress,
    egress_in_force,
    https_ports,
    mask_host,
)  # fmt: skip
from activator._records import Egress
from pool import ALL_TRAFFIC, EgressRules

ALL = "0.0.0.0/0"


@pytest.mark.parametrize(
    ("allow", "deny", "internet", "in_force"),
    [
        (None, None, None, Egress()),
        ([], [], True, Egress()),
        (["1.1.1.1"], [ALL], None, Egress(allow_out=("1.1.1.1",), deny_out=(ALL,))),
        (None, ["203.0.113.0/24", "2001:db8::/32", "198.51.100.7"], None,
         Egress(deny_out=("203.0.113.0/24", "2001:db8::/32", "198.51.100.7"))),
        (["example.com", "*.example.com"], [ALL], None,
         Egress(allow_out=("example.com", "*.example.com"), deny_out=(ALL,))),
        (["*"], [ALL, "203.0.113.1"], None, Egress(allow_out=("*",), deny_out=(ALL, "203.0.113.1"))),
        # allow_internet_access=false: deny becomes ALL_TRAFFIC, whatever it held; allow stays (it wins)
        (None, None, False, Egress(deny_out=(ALL,))),
        (["203.0.113.5"], ["198.51.100.0/24"], False, Egress(allow_out=("203.0.113.5",), deny_out=(ALL,))),
        (["203.0.113.0/33"], [ALL], None, Egress(allow_out=("203.0.113.0/33",), deny_out=(ALL,))),  # a name here
    ],
)  # fmt: skip
def test_accepted_rules_are_kept_as_given_with_internet_access_folded_in(
    allow: list[str] | None, deny: list[str] | None, internet: bool | None, in_force: Egress
) -> None:
    assert egress_in_force(allow, deny, allow_internet_access=internet) == in_force


@pytest.mark.parametrize(
    ("allow", "deny", "message"),
    [
        (None, ["example.com"], "invalid denied CIDR example.com"),
        (None, ["0.0.0.0"], "invalid denied CIDR 0.0.0.0"),
        (None, ["0.0.0.0/8"], "invalid denied CIDR 0.0.0.0/8"),
        (None, ["::/0"], "invalid denied CIDR ::/0"),  # E2B's ALL_TRAFFIC is 0.0.0.0/0 only
        (None, ["203.0.113.0/33"], "invalid denied CIDR 203.0.113.0/33"),
        (None, ["203.0.113.0/255.255.255.0"], "invalid denied CIDR 203.0.113.0/255.255.255.0"),
        (None, ["fe80::1%eth0"], "invalid denied CIDR fe80::1%eth0"),
        (None, ["203.0.113.1:80"], "invalid denied CIDR 203.0.113.1:80"),
        (["0.0.0.0"], [ALL], "invalid allowed address 0.0.0.0"),
        (["::"], None, "invalid allowed address ::"),
        (["example.com"], None, DOMAINS_NEED_ALL_TRAFFIC),
        (["example.com"], ["203.0.113.0/24"], DOMAINS_NEED_ALL_TRAFFIC),
        (["example.com:443"], [ALL], "invalid allowed address example.com:443: an entry holds for every port here"),
        (["203.0.113.1:80"], [ALL], "invalid allowed address 203.0.113.1:80: an entry holds for every port here"),
        ([""], [ALL], "invalid allowed address : an entry holds for every port here"),
    ],
)
def test_refused_rules_say_why_in_e2b_words(allow: list[str] | None, deny: list[str] | None, message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        egress_in_force(allow, deny, allow_internet_access=None)
    assert refused.value.message == message
    assert refused.value.status_code == 400


def test_domains_need_all_traffic_denied_even_with_internet_access_off() -> None:
    """E2B checks the request's denyOut, before `allow_internet_access=false` is folded in."""
    with pytest.raises(InvalidRequest, match="ALL_TRAFFIC"):
        egress_in_force(["example.com"], None, allow_internet_access=False)


def test_all_traffic_stands_for_both_address_families_at_the_runtime() -> None:
    rules = Egress(allow_out=("203.0.113.5", ALL), deny_out=(ALL, "198.51.100.1")).rules
    assert rules == EgressRules(allow_out=("203.0.113.5", *ALL_TRAFFIC), deny_out=(*ALL_TRAFFIC, "198.51.100.1"))
    assert not Egress(deny_out=(ALL,)).rules.internet
    assert Egress().rules == EgressRules()


@pytest.mark.parametrize(
    "mask",
    ["localhost", "localhost:${PORT}", "${PORT}-myapp.example.com", "app.example.com:8080", "Example.COM.", "a-b.c"],
)
def test_masks_that_can_be_a_host_header_are_kept(mask: str) -> None:
    assert mask_host(mask) == mask


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        ("bücher.de", "mask request host 'bücher.de' is not ASCII. Please use ASCII characters only."),
        ("bücher.de:80", "mask request host 'bücher.de' is not ASCII. Please use ASCII characters only."),
        ("[::1]:80", "mask request host is not valid: [::1]:80"),
        ("a:b:c", "mask request host is not valid: a:b:c"),
        ("under_score.example.com", "mask request host is not valid: under_score.example.com"),
        ("-leading.example.com", "mask request host is not valid: -leading.example.com"),
        ("two..dots", "mask request host is not valid: two..dots"),
        ("", "mask request host is not valid: "),
        (":8080", "mask request host is not valid: :8080"),
        ("localhost:http", "mask request host is not valid: localhost:http"),
        ("localhost:70000", "mask request host is not valid: localhost:70000"),
        ("host with space", "mask request host is not valid: host with space"),
        ("${HOST}.example.com", "mask request host is not valid: ${HOST}.example.com"),
    ],
)
def test_masks_that_cannot_be_a_host_header_are_refused(mask: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        mask_host(mask)
    assert refused.value.message == message


@pytest.mark.parametrize(
    ("public", "secure", "refused"), [(True, False, False), (False, True, False), (False, False, True)]
)
def test_private_ports_need_a_secured_envd(public: bool, secure: bool, refused: bool) -> None:
    if refused:
        with pytest.raises(InvalidRequest, match="without public access unless you enable secure envd access"):
            check_private_ingress(public=public, secure=secure)
    else:
        check_private_ingress(public=public, secure=secure)


@pytest.mark.parametrize(
    ("ports", "kept"),
    [
        ([], ()),
        ([8443, 3000, 8443], (3000, 8443)),
        ([1, 65535], (1, 65535)),
        (list(range(1, MAX_HTTPS_PORTS + 1)), tuple(range(1, MAX_HTTPS_PORTS + 1))),
        ([3000] * (MAX_HTTPS_PORTS + 1), (3000,)),  # counted once duplicates are folded
    ],
)
def test_https_ports_are_kept_sorted_and_each_once(ports: list[int], kept: tuple[int, ...]) -> None:
    assert https_ports(ports) == kept


@pytest.mark.parametrize(
    ("ports", "message"),
    [
        ([0], "invalid https port 0: ports are 1 to 65535"),
        ([65536], "invalid https port 65536"),
        ([3000, 49983], "the envd port (49983) cannot be listed in httpsPorts"),
        (list(range(1, MAX_HTTPS_PORTS + 2)), f"httpsPorts lists {MAX_HTTPS_PORTS + 1} ports; at most 100"),
    ],
)
def test_https_ports_that_cannot_be_served_are_refused(ports: list[int], message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        https_ports(ports)
    assert message in str(refused.value)
