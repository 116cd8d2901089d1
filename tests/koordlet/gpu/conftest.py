# One API server per module, wiped between tests (same fixtures as the device plugin tests).
from tests.koordlet.deviceplugin.conftest import kube, kube_module  # noqa: F401
