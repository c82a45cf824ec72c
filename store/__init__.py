"""The model store: bundled fetch, hub models, GGUF import, records and staged writes."""
