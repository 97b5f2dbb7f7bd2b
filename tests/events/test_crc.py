import os

import pytest

from msmon_nb.events import crc


def test_known_vector():
    # RFC 3720 / iSCSI check value
    assert crc.crc32c(b"123456789") == 0xE3069283
    assert crc.crc32c_pure(b"123456789") == 0xE3069283


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099])
def test_native_matches_pure(size):
    data = os.urandom(size)
    assert crc.crc32c(data) == crc.crc32c_pure(data)
    assert crc.NATIVE, "the crc32c wheel should be installed with the package"


def test_mask_matches_tfrecord_definition():
    value = crc.crc32c(b"abc")
    expected = (((value >> 15) | (value << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert crc.masked_crc32c(b"abc") == expected == crc.mask(value)
