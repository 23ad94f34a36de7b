"""Exporting controllers: ONNX with metadata (``onnx_export``, ``metadata``),
verification against torch (``verify``), dependency-free C (``c_codegen``,
``c_build``), the session the serial bridge runs (``session``), float32 ops
that export bit-exactly (``portable``), and the ``export``/``inspect``/
``verify`` commands (``cli_*``). See docs/export.md."""
