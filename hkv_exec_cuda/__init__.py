"""CuPy/CUDA executor behind the same narrow interface (comes in its own issue).

CuPy is an optional extra (`pip install hkv[cuda]`) and is never imported
eagerly: nothing here imports it yet.
"""
