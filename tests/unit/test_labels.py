"""Local version labels and wheel names: they round-trip, through packaging, to the cell."""

from __future__ import annotations

import pytest
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from scripts.factory.labels import LocalLabel, cell_for_wheel, parse_wheel_name
from scripts.factory.model import Cell, Target, parse_targets


def cell(**kw) -> Cell:
    fields = dict(os="linux", python="3.12", torch="2.12.0", cuda="13.0",
                  targets=(Target(75, True),))
    fields.update(kw)
    return Cell(**fields)


def test_seed_label_and_wheel_name():
    seed = cell()
    assert str(seed.label) == "sm75.torch2.12cu130"
    assert str(seed.version("2.2.0")) == "2.2.0+sm75.torch2.12cu130"
    assert seed.id == "linux-cp312-torch2.12-cu130-sm75"
    assert seed.torch_requirement == "torch==2.12.*"


@pytest.mark.parametrize("sms, torch, cuda, text", [
    ((75,), "2.12.0", "13.0", "sm75.torch2.12cu130"),
    ((80, 86, 90), "2.14.1+cu130", "13.0", "sm80.sm86.sm90.torch2.14cu130"),
    ((89,), "2.8.0", "12.8", "sm89.torch2.8cu128"),
    ((80, 120), "10.11", "12.9", "sm80.sm120.torch10.11cu129"),
])
def test_label_round_trips_through_packaging(sms, torch, cuda, text):
    label = LocalLabel.create(sms, torch, cuda)
    assert str(label) == text
    version = Version(f"2.2.0+{label}")
    assert version.local == text
    assert LocalLabel.parse(version.local) == label


def test_label_parse_accepts_normalized_separators():
    assert LocalLabel.parse("SM80-sm90_torch2.14cu130") == LocalLabel((80, 90), (2, 14), (13, 0))


NOT_A_LABEL = "not a sageattention local label"
NOT_ASCENDING = r"label SMs must be ascending and unique"


@pytest.mark.parametrize("bad, why", [
    ("sm75", NOT_A_LABEL), ("torch2.12cu130", NOT_A_LABEL), ("sm75.torch2cu130", NOT_A_LABEL),
    ("cpu.torch2.14cu130", NOT_A_LABEL), ("", NOT_A_LABEL), ("sm80.torch2.14", NOT_A_LABEL),
    ("sm90.sm80.torch2.14cu130", NOT_ASCENDING + r", got \[90, 80\]"),
    ("sm80.sm80.torch2.14cu130", NOT_ASCENDING + r", got \[80, 80\]"),
])
def test_label_parse_rejects_non_canonical_or_foreign_labels(bad, why):
    # each is refused for its own reason: a string that is not a label at all, or a label whose
    # SMs are out of order or repeated (which would give one wheel two names)
    with pytest.raises(ValueError, match=why):
        LocalLabel.parse(bad)


def test_label_construction_refuses_what_it_cannot_spell():
    with pytest.raises(ValueError, match="at least one SM"):
        LocalLabel((), (2, 14), (13, 0))
    with pytest.raises(ValueError, match="CUDA minor version must be one digit, got 10"):
        LocalLabel.create((80,), "2.14", "12.10")
    # create sorts and de-duplicates what it is given, so its labels always parse back
    assert str(LocalLabel.create((90, 80, 90), "2.14.1", "13.0")) == "sm80.sm90.torch2.14cu130"


def test_wheel_name_parses_back_to_its_cell():
    cells = [cell(), cell(os="windows"), cell(python="3.11", torch="2.14.1",
                                              targets=(Target(80), Target(90)))]
    name = "sageattention-2.2.0+sm75.torch2.12cu130-cp312-cp312-manylinux_2_34_x86_64.whl"
    assert cell_for_wheel(name, cells) is cells[0]
    assert cell_for_wheel(name.replace("manylinux_2_34_x86_64", "win_amd64"), cells) is cells[1]
    multi = "sageattention-2.2.0+sm80.sm90.torch2.14cu130-cp311-cp311-linux_x86_64.whl"
    assert cell_for_wheel(multi, cells) is cells[2]
    # packaging agrees with our reading of the name
    _name, version, _build, tags = parse_wheel_filename(multi)
    assert version == parse_wheel_name(multi).version and len(tags) == 1


def test_wheel_name_errors_are_specific():
    with pytest.raises(ValueError, match="no local label"):
        parse_wheel_name("sageattention-2.2.0-cp312-cp312-linux_x86_64.whl")
    with pytest.raises(ValueError, match="not a sageattention wheel"):
        parse_wheel_name("flash_attn-2.2.0+sm75.torch2.12cu130-cp312-cp312-linux_x86_64.whl")
    with pytest.raises(ValueError, match="matches 0 matrix cells"):
        cell_for_wheel("sageattention-2.2.0+sm86.torch2.12cu130-cp312-cp312-linux_x86_64.whl",
                       [cell()])


def test_target_lists_from_the_environment_form():
    assert parse_targets("sm90+PTX;sm80") == (Target(80), Target(90, True))
    assert [str(t) for t in parse_targets("sm75+ptx, sm86")] == ["sm75+PTX", "sm86"]
    with pytest.raises(ValueError, match="twice"):
        parse_targets("sm80;sm80+PTX")
    with pytest.raises(ValueError, match="not an SM target"):
        parse_targets("ampere")
