"""``gristmill serve``: training batches over Arrow Flight (docs/service.md).

- ``protocol.py``: the request (a JSON ``Ticket``) and the reply's schema;
- ``catalog.py``: the server's index sha256 -> manifest URL over its stores, rescanned on a miss;
- ``server.py``: the Flight server (``GristmillServer``, on grpcio), auth and TLS;
- ``wire.py``: Flight's protobuf messages, by hand, and the request cap;
- ``admission.py``: admission by streams and reply bytes per client identity; idle streams cancelled;
- ``config.py``: ``ServeConfig``, the start's settings, checked before the server (grpc, pyarrow) is imported;
- ``client.py``: ``ServiceBatches``, what a ``Loader`` with ``Source(service=...)`` delegates to.

Imported only where used (pyarrow.flight is not loaded by ``import gristmill.loader``).
"""
