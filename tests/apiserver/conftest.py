"""Fixtures for the test API server's own tests: one server and one real client per test."""

from __future__ import annotations

import kubernetes.client
import pytest


@pytest.fixture
def core(api_client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api_client)


@pytest.fixture
def custom(api_client: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api_client)


@pytest.fixture
def policy(api_client: kubernetes.client.ApiClient) -> kubernetes.client.PolicyV1Api:
    return kubernetes.client.PolicyV1Api(api_client)
