"""Fixtures for the test API server's own tests: one server and one real client per test."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest

from tests.support.apiserver import ApiServer, kube_api_client


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer() as running:
        yield running


@pytest.fixture
def api_client(server: ApiServer) -> Iterator[kubernetes.client.ApiClient]:
    with kube_api_client(server) as client:
        yield client


@pytest.fixture
def core(api_client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api_client)


@pytest.fixture
def custom(api_client: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api_client)


@pytest.fixture
def policy(api_client: kubernetes.client.ApiClient) -> kubernetes.client.PolicyV1Api:
    return kubernetes.client.PolicyV1Api(api_client)
