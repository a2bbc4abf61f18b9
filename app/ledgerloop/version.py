"""The package version, in a leaf module so any part can read it without importing the facade."""

__version__ = "0.1.0"
