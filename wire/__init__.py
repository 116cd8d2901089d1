"""The wire contracts shared by the proxy and the agent, apart from both (as NRI keeps ``pkg/api``).

Here: the generated protobuf and gRPC stubs of ``proto/`` (``*_pb2*.py``, written by ``make proto``;
do not edit them), ``sockets``, the unix-socket helpers both servers use, and ``files``, the atomic file
write both sides' state and report files use.

Rule (tests/test_layering.py): ``wire`` imports nothing of ``koordlet``, ``runtimeproxy`` or ``hooks``.
"""
