"""Shared by the third-party trainer tests."""

import mindspore as ms
import pytest


@pytest.fixture
def graph_mode():
    """GRAPH_MODE for the test (as those suites' training scripts set it), PyNative after."""
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)
