"""What loads and runs compiled graphs (the C++ build with its disk cache is kiln/native/build.py):
the compiled graph and its artifact (compiled_graph.py), what the AOT graph cache keeps (saved.py),
frozen constants kept valid (frozen.py), per-size compilation at call time (specialized.py), and
the record of graphs that fell back to eager (fallback.py)."""
