"""The GPU instance catalog: schema-valid data and the facts the platform relies on."""

from __future__ import annotations

import pytest

from trainstack.catalog import UnknownInstanceTypeError, catalog, lookup

REQUIRED = (
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
    "p6-b200.48xlarge",
    "g5.xlarge",
    "g5.12xlarge",
    "g5.48xlarge",
    "g6e.12xlarge",
    "g6e.48xlarge",
)


def test_catalog_covers_the_supported_families() -> None:
    assert set(REQUIRED) <= set(catalog())


@pytest.mark.parametrize(
    ("name", "gpus", "model", "efa"),
    [
        ("p4d.24xlarge", 8, "A100", 4),
        ("p5.48xlarge", 8, "H100", 32),
        ("p5e.48xlarge", 8, "H200", 32),
        ("p5en.48xlarge", 8, "H200", 16),
        ("p6-b200.48xlarge", 8, "B200", 8),
        ("g5.xlarge", 1, "A10G", 0),
        ("g5.8xlarge", 1, "A10G", 1),
        ("g6e.24xlarge", 4, "L40S", 2),
        ("g6e.48xlarge", 8, "L40S", 4),
    ],
)
def test_facts_per_family(name: str, gpus: int, model: str, efa: int) -> None:
    entry = lookup(name)
    assert (entry.gpus, entry.gpu_model, entry.efa_devices) == (gpus, model, efa)
    assert entry.supports_efa is (efa > 0)


def test_efa_cards_fit_the_network_cards() -> None:
    for entry in catalog().values():
        assert all(0 <= card < entry.network_cards for card in entry.efa_cards), entry.name
        # the primary ENA sits on card 0, so an EFA layout must start there
        assert not entry.efa_cards or entry.efa_cards[0] == 0, entry.name


def test_unknown_type_names_the_closest_and_the_known_ones() -> None:
    with pytest.raises(UnknownInstanceTypeError) as caught:
        lookup("p5.48xlarg")
    message = str(caught.value)
    assert "unknown instance type 'p5.48xlarg' (did you mean 'p5.48xlarge'?)" in message
    assert "p4d.24xlarge" in message
    assert "g6e.48xlarge" in message
