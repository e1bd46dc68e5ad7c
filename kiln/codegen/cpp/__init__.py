"""C++/OpenMP kernels from loop-IR nodes (printer.py: ops -> C++ expressions; kernel.py: loops)."""
