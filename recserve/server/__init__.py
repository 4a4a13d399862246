"""The gRPC prediction server: wire codecs, dynamic batcher, data plane, services, metrics, reload, workers.

Run it with ``recserve serve --package PKG``; embed it with ``recserve.server.app.RecServer``.
"""
