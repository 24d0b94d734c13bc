"""The kubelet's pod-resources API (v1): generated protobuf and gRPC code.

``api.proto`` is the source; ``api_pb2.py``, ``api_pb2.pyi`` and ``api_pb2_grpc.py`` are
generated from it by ``python -m lockstep.collectors.kubernetes.podresources.generate`` and checked in, so an
install needs no code generator.  Import them only where a call is about to be made: grpc
takes a tenth of a second to import, which ``lockstep --help`` should not pay.
"""
