"""The application: CLI, settings, dialogue and (later) the voice pipeline and UI."""
