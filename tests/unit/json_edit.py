"""A copy of a JSON-like document with one value changed or removed, for tests of what a reader
refuses."""

from __future__ import annotations

import copy


def with_value(document, path, value):
    """A deep copy of `document` with the key or index at `path` (a sequence of them) set to
    `value`, or deleted where `value` is `...`."""
    data = copy.deepcopy(document)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data
