"""The commands: chat, headless run, engine, models and serve."""
