"""``gristmill serve``: training batches over Arrow Flight (docs/service.md).

- ``protocol.py``: the request (a JSON ``Ticket``) and the reply's schema;
- ``catalog.py``: the server's index sha256 -> manifest URL over its stores, rescanned on a miss;
- ``server.py``: the Flight server (``GristmillServer``), auth and TLS;
- ``config.py``: ``ServeConfig``, the start's settings, checked before the server (and torch) is imported;
- ``client.py``: ``ServiceBatches``, what a ``Loader`` with ``Source(service=...)`` delegates to.

Imported only where used (pyarrow.flight is not loaded by ``import gristmill.loader``).
"""
