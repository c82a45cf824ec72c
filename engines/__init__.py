"""LLM decoder backends behind one Decoder protocol."""
