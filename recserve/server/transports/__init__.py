"""The wire edge: gRPC, Open Inference Protocol (+ Triton extensions) and REST over the data plane."""
