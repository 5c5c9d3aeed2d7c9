"""Process-wide settings, read from the environment once and on demand."""
