"""pool layer."""
