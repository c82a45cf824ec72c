"""The decoder architecture, its config, weight loading and the model store."""
