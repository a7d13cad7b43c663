"""The op schemas each family's bindings.cpp defines, read from the C++ sources without building.

A family's TORCH_LIBRARY block calls m.def(...) with either a string literal (sm75, its own
schema) or one of the shared schemas of csrc/common/op_schemas.h (sage::schema::kName).
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LITERALS = r'((?:"[^"]*"\s*)+)'


def _join(literals: str) -> str:
    return "".join(re.findall(r'"([^"]*)"', literals))


def shared_schemas() -> dict[str, str]:
    """csrc/common/op_schemas.h: constant name -> schema."""
    text = (ROOT / "csrc" / "common" / "op_schemas.h").read_text()
    found = re.findall(r"inline constexpr const char (\w+)\[\] =\s*" + _LITERALS + ";", text)
    return {name: _join(literals) for name, literals in found}


def bindings_text(family: str) -> str:
    return (ROOT / "csrc" / family / "bindings.cpp").read_text()


def family_schemas(family: str) -> list[str]:
    """The schemas csrc/<family>/bindings.cpp defines, in order."""
    text = bindings_text(family)
    body = re.search(rf"TORCH_LIBRARY\(sageattention_{family}, m\) \{{(.*?)\n\}}", text, re.S)
    assert body, f"no TORCH_LIBRARY block in csrc/{family}/bindings.cpp"
    shared = shared_schemas()
    schemas = []
    for arg in re.findall(r"m\.def\(\s*(.*?)\);", body.group(1), re.S):
        named = re.fullmatch(r"sage::schema::(\w+)", arg.strip())
        if named:
            assert named[1] in shared, f"csrc/{family}/bindings.cpp: {named[1]} is not in op_schemas.h"
            schemas.append(shared[named[1]])
        else:
            assert re.fullmatch(_LITERALS, arg.strip()), f"csrc/{family}/bindings.cpp: m.def({arg})"
            schemas.append(_join(arg))
    return schemas


def defined_ops(family: str) -> list[str]:
    return [s.split("(")[0] for s in family_schemas(family)]
