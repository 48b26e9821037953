"""The package version, in a module of its own: low layers read it without importing the
package face (squant/__init__.py imports them)."""

__version__ = "0.1.0"
