"""hkv package."""
