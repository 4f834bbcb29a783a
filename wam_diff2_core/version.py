"""The package's version: the one source (setup.py reads it; package.xml must carry the same
string, which test/project/test_package_manifest.py checks; every entry point prints it on --version)."""
__version__ = "0.3.0"
