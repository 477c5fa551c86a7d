"""A set's elements are held packed (model.ElementMap) and read back as the Elements they were.

Issue 17: 120k elements at 10k services; nearly all are map elements without a comment, held as
their (shared) value text instead of a tuple each.
"""

from __future__ import annotations

import copy

import pytest

from kubeproxy.backends.nftables.rendered_table import COMPACT_MIN, OverlayMap
from kubeproxy.backends.nftables.table_objects import (
    ELEMENTS_PER_LINE,
    NO_VALUE,
    Element,
    ElementMap,
    add_lines,
    element_lines,
    pack,
    unpack,
)

SHAPES = [
    Element("10.0.0.1"),  # a set element
    Element("10.96.0.1 . tcp . 80 . 0", "10.180.0.1 . 8080"),  # a selector map element
    Element("10.96.0.1 . tcp . 80", "goto reject-chain", "ns/svc:http"),  # with a comment
    Element("10.96.0.1", None, "a set element with a comment"),
]


@pytest.mark.parametrize("e", SHAPES, ids=repr)
def test_an_element_reads_back_as_it_was_written(e: Element) -> None:
    assert unpack(e.key, pack(e.value, e.comment)) == e
    m = ElementMap()
    m[e.key] = e
    assert m[e.key] == e and m.get(e.key) == e and list(m.items()) == [(e.key, e)]


def test_only_commented_elements_keep_a_tuple_and_never_their_key_twice() -> None:
    assert pack(None, None) is NO_VALUE
    value = "10.180.0.1 . 8080"
    assert pack(value, None) is value  # shared with every other element that has this value
    assert pack("drop", "ns/svc:http") == Element("", "drop", "ns/svc:http")


def test_an_element_map_is_a_mapping_like_the_dict_it_replaces() -> None:
    m, d = ElementMap(), {}
    for e in SHAPES:
        m[e.key] = e
        d[e.key] = e
    assert dict(m) == d and len(m) == len(d) and set(m.keys()) == set(d)
    assert "10.0.0.1" in m and "nope" not in m and m.get("nope") is None
    del m["10.0.0.1"]
    assert "10.0.0.1" not in m and len(m) == len(d) - 1
    twin = copy.copy(m)
    twin["10.0.0.2"] = Element("10.0.0.2")
    assert "10.0.0.2" not in m  # a copy, not a view
    assert ElementMap(dict(m.raw)) == m


def test_a_layered_set_folds_into_a_packed_copy_and_leaves_its_base_alone() -> None:
    base = ElementMap()
    for i in range(COMPACT_MIN * 2):
        base[f"k{i}"] = Element(f"k{i}", f"v{i}")
    child = OverlayMap.over(base)
    for i in range(COMPACT_MIN + 1):
        child[f"n{i}"] = Element(f"n{i}", None, "c")
    child.pop("k0")
    grandchild = OverlayMap.over(child)  # the overlay outgrew COMPACT_MIN: folded into a new base
    assert isinstance(grandchild.base, ElementMap) and grandchild.base is not base
    assert "k0" in base and "k0" not in grandchild and grandchild["n3"] == Element("n3", None, "c")
    assert dict(grandchild) == dict(child) and len(grandchild) == len(child)


def test_add_lines_read_from_the_packed_form_are_element_lines_text() -> None:
    m = ElementMap()
    for i in range(ELEMENTS_PER_LINE + 5):
        for e in SHAPES:
            m[f"{e.key}-{i}"] = e._replace(key=f"{e.key}-{i}")
    keys = sorted(m)
    want = list(element_lines("add", "ip kube-proxy", "s", map(m.__getitem__, keys)))
    assert list(add_lines("ip kube-proxy", "s", m, keys)) == want
    assert list(add_lines("ip kube-proxy", "s", dict(m), keys)) == want  # any other mapping: the general way
    assert len(want) == 5
