"""A run's directory: its names (:mod:`.layout`), its start, resume and completion markers
(:mod:`.state`) and its manifest (:mod:`.manifest`).

Nothing is imported here, so that low layers (the shard writer) can use :mod:`.layout` without
loading the run's state machinery.
"""
