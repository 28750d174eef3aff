"""The store: Parquet schemas (:mod:`.schemas`), the :class:`~.store.Store`, and its part writing (:mod:`.parts`)."""
