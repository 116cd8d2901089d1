"""proto/deviceplugin.proto must stay wire-compatible with kubelet's v1beta1 API (docs/node-interfaces.md §7.1)."""

import pytest

from wire import deviceplugin_pb2 as pb

EXPECTED = {
    "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
    "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
    "ListAndWatchResponse": {"devices": 1},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "Device": {"ID": 1, "health": 2, "topology": 3},
    "PreStartContainerRequest": {"devices_ids": 1},
    "PreferredAllocationRequest": {"container_requests": 1},
    "ContainerPreferredAllocationRequest": {"available_deviceIDs": 1, "must_include_deviceIDs": 2,
                                            "allocation_size": 3},
    "PreferredAllocationResponse": {"container_responses": 1},
    "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
    "AllocateRequest": {"container_requests": 1},
    "ContainerAllocateRequest": {"devices_ids": 1},
    "AllocateResponse": {"container_responses": 1},
    "ContainerAllocateResponse": {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
    "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
    "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
    "CDIDevice": {"name": 1},
}


@pytest.mark.parametrize("message", sorted(EXPECTED))
def test_field_numbers_match_kubelet_v1beta1(message: str) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == EXPECTED[message]
    assert descriptor.full_name == f"v1beta1.{message}"


def test_services_and_methods_match_kubelet_v1beta1() -> None:
    services = {s.name: sorted(m.name for m in s.methods) for s in pb.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "Registration": ["Register"],
        "DevicePlugin": ["Allocate", "GetDevicePluginOptions", "GetPreferredAllocation", "ListAndWatch",
                         "PreStartContainer"],
    }
    assert pb.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming
