"""Generated protobuf and gRPC stubs (make proto). Do not edit."""
