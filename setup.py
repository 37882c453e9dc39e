"""Build hook: the native C kernels are compiled here (see native/README or native/__init__ docstring)."""
from setuptools import setup

setup()
