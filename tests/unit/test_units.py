import pytest

from oomguard._units import format_bytes

MiB, GiB = 2**20, 2**30


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (5 * MiB, "5 MiB"),
        (300 * MiB, "300 MiB"),
        (573.59 * MiB, "574 MiB"),
        (4 * GiB, "4 GiB"),
        (1.02 * GiB, "1.02 GiB"),
        (1.5 * GiB, "1.5 GiB"),
        (12.34 * GiB, "12.3 GiB"),
        (1023.9 * MiB, "1 GiB"),
        (2**41, "2 TiB"),
        (-3 * MiB, "-3 MiB"),
    ],
)
def test_three_significant_digits_without_trailing_zeros(n, text):
    assert format_bytes(n) == text


def test_a_peak_just_over_its_limit_still_reads_as_over():
    assert format_bytes(1.02 * GiB) != format_bytes(GiB)
