"""The wheel factory: build_matrix.yaml -> cells -> exact, repaired, self-describing wheels.

Importing this package (or any module in it) has no side effects: it runs no command and
reads no file until a function is called. Command-line entry points are ``main(argv)``
functions; ``python -m scripts.factory --help`` lists them.
"""
