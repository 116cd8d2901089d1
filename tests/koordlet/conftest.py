"""Fixtures shared by the koordlet tests that talk to the test API server through a whole node setup."""

from collections.abc import Iterator

import pytest

from tests.koordlet.deviceplugin.kube import Kube, kube_env


@pytest.fixture(scope="module")
def kube_module() -> Iterator[Kube]:
    with kube_env() as env:
        yield env


@pytest.fixture
def kube(kube_module: Kube) -> Iterator[Kube]:
    try:
        yield kube_module
    finally:
        kube_module.reset()
