"""TensorRT and TensorRT-RTX engines of the decoder: build, cache, run (see ``docs/engines.md``).

Importing this package imports no TensorRT: ``options``, ``profiles``, ``cache`` and
``progress`` are pure Python; ``builder``, ``runtime`` and ``backend`` import the flavour on use.
"""
