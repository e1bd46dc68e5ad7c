"""Code generation from the loop IR: cpp/ (C++/OpenMP), wrapper (calls kernels and externs)."""
