"""Code generation: prints code and nothing else. cpp/ prints a schedule's kernels as C++/OpenMP
(library.py, kernel.py, body.py, printer.py); wrapper.py prints the Python function that calls them
and the externs. Building and loading what is printed is the runtime's (kiln/runtime/)."""
