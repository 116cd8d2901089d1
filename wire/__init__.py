"""The wire contracts shared by the proxy and the agent, apart from both (as NRI keeps ``pkg/api``).

Here: the generated protobuf and gRPC stubs of ``proto/`` (``*_pb2*.py``, written by ``make proto``;
do not edit them) and ``sockets``, the unix-socket helpers both servers use.

Rule (tests/test_layering.py): ``wire`` imports nothing of ``koordlet``, ``runtimeproxy`` or ``hooks``.
"""
