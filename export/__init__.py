"""Exporting controllers: ONNX with metadata (``onnx_export``, ``metadata``),
verification against torch (``verify``), dependency-free C (``c_codegen``,
``c_build``), the session the serial bridge runs (``session``), and the
``export``/``inspect``/``verify`` commands (``cli_*``). (The float32 ops that
export bit-exactly, which only hand-written controllers need, are
``grpo_ctrl.baselines.portable``.) See docs/export.md."""
