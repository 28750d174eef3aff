"""Loading a PATH: a dump directory, the hook's run directory or a store, into one :class:`Inputs` bundle."""
