"""The one function behind each Luigi task (tasks/ calls these; no Luigi here)."""
