"""The translation unit of kiln's CPU kernels: kiln's own GEMM (include/kiln_gemm.h, its weight-only
quantized form include/kiln_gemm_quant.h), its depthwise
convolution and attention, with the C entries over them (`source`), and the constants Python needs
to call them. It is a unit of kiln's runtime library (libkiln.py), where kiln::mm, kiln::conv and
kiln::attention call the kernels (src/kiln_runtime.cpp), and of an exported model's library
(kiln/deploy/export.py). Tests and sweeps call the kernels directly through ctypes
(benchmarks/kernels.py).
"""

from __future__ import annotations

import torch

from kiln.native import header_text

# The dtypes kiln's GEMM is built for, their suffixes in the C entries' names and their C++ types.
DTYPES = (torch.float32, torch.bfloat16)
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
CTYPES = {"f32": "float", "bf16": "kiln_bf16"}

# K longer than this is cut in blocks of equal size, none longer: each block of A stays in L2 while
# the thread's panels stream past (blocks of 1024 beat 768 and 1536 at K = 2048 and 3072 with the
# weights out of cache, 2048^3 included; shorter blocks cost more in C's partial sums).
K_BLOCK = 1024


def _entries() -> str:
    lines = ['extern "C" {', "int kiln_gemm_nr() { return kiln_gemm::NR; }", "int kiln_vec_lanes() { return kiln::L; }",
             f"int64_t kiln_gemm_k_block() {{ return {K_BLOCK}; }}",
             "int kiln_gemm_ahead_shift(int64_t tiles, int64_t steps, int64_t lines) "
             "{ return kiln_gemm::ahead_shift(tiles, steps, lines); }",
             "int kiln_gemm_split(int64_t panels, int64_t row_blocks, int last_vectors, int threads) "
             "{ int tn, tm; kiln_gemm::split(panels, row_blocks, last_vectors, threads, tn, tm); return tn; }",
             # bfloat16 fast math's A: a float32 A as the bfloat16 copy kiln_gemm_bf16 reads
             "void kiln_gemm_convert_a_bf16(int64_t M, int64_t K, const float* a, int64_t lda, kiln_bf16* out) "
             "{ kiln_gemm::convert_a_bf16(M, K, a, lda, out); }",
             # How the tiles multiply bfloat16 pairs (kiln_gemm::Bf16Product; -1: no pairs on this CPU):
             # the one this CPU measured the fastest, and (tests) one forced, -1 to measure again.
             "int32_t kiln_gemm_bf16_product(void) { return kiln_gemm::bf16_fastest_product(); }",
             "void kiln_gemm_bf16_force_product(int32_t product) { kiln_gemm::bf16_product_forced.store(product); }",
             # whether this build and the OS let the tiles multiply on AMX (kiln_gemm_amx.h; tests)
             "int32_t kiln_gemm_bf16_amx(void) {\n#ifdef KILN_GEMM_AMX\n return kiln_gemm::amx_usable();\n#else\n return 0;\n#endif\n}",
             # whether the panels lie on 2 MB pages: one-row products read fewer runs (kiln_gemm::huge_page_packs)
             "void kiln_gemm_set_huge_page_packs(int32_t on) { kiln_gemm::huge_page_packs.store(on != 0); }",
             "int32_t kiln_gemm_huge_page_packs(void) { return kiln_gemm::huge_page_packs.load(); }",
             # whether one-row products (float32, bfloat16 pairs) read their 2 MB pages in runs asked for into L1 (kiln_gemm::near_gemv)
             "void kiln_gemm_set_near_gemv(int32_t on) { kiln_gemm::near_gemv.store(on != 0); }",
             "int32_t kiln_gemm_near_gemv(void) { return kiln_gemm::near_gemv.load(); }",
             # (tests: kiln_gemm::SharedPanels, the one-row products' panels shared out for balance)
             "void kiln_gemm_shared_panels_take(int64_t panels, int32_t threads, int32_t team, int32_t late, "
             "int32_t* counts, int64_t* taken) "
             "{ kiln_gemm::shared_panels_take(panels, threads, team, late != 0, counts, taken); }",
             # (tests: kiln_gemm::Scratch, a product's temporaries in blocks a thread keeps)
             "void kiln_gemm_scratch_blocks(int64_t bytes, void** out) { kiln_gemm::scratch_blocks(bytes, out); }"]
    for suffix, ctype in CTYPES.items():
        lines += [
            f"int64_t kiln_gemm_packed_elements_{suffix}(int64_t K, int64_t N) "
            f"{{ return kiln_gemm::packed_elements<{ctype}>(K, N); }}",
            f"void kiln_gemm_pack_{suffix}(const {ctype}* b, int64_t K, int64_t N, int64_t sk, int64_t sn, {ctype}* out) "
            "{ kiln_gemm::pack_b(b, K, N, sk, sn, out); }",
            f"void kiln_gemm_{suffix}(int64_t M, int64_t N, int64_t K, const {ctype}* a, int64_t lda, const {ctype}* bp, "
            "void* c, int64_t ldc, const kiln_gemm::Epilogue* e, int64_t kc) "
            "{ kiln_gemm::gemm(M, N, K, a, lda, bp, c, ldc, e, kc); }",
        ]
    # Its weight-only quantized form (include/kiln_gemm_quant.h): `bits` 8 or 4.
    quant_shape = "kiln_gemm::QuantShape{bits, K, N, group}"
    lines += [
        f"int64_t kiln_gemm_quant_packed_bytes(int32_t bits, int64_t K, int64_t N, int64_t group) {{ return {quant_shape}.bytes(); }}",
        # a panel's columns (a gated product's halves are whole panels: kiln_runtime.cpp mm_quant_gated)
        "int64_t kiln_gemm_panel_columns() { return kiln_gemm::NR; }",
        "void kiln_gemm_quant_pack(int32_t bits, int64_t K, int64_t N, int64_t group, const uint8_t* q, const float* scales, "
        f"const float* zeros, uint8_t* out) {{ kiln_gemm::pack_quant({quant_shape}, q, scales, zeros, out); }}",
        "void kiln_gemm_quant_f32(int32_t bits, int64_t M, int64_t N, int64_t K, int64_t group, const float* a, int64_t lda, "
        "const uint8_t* packed, void* c, int64_t ldc, const kiln_gemm::Epilogue* e, int64_t kc) "
        f"{{ kiln_gemm::gemm_quant({quant_shape}, M, a, lda, packed, c, ldc, e, kc); }}",
        # bfloat16 fast math over the quantized weight (a prompt's rows on AMX where it is the bfloat16 product)
        "void kiln_gemm_quant_bf16_math(int32_t bits, int64_t M, int64_t N, int64_t K, int64_t group, const float* a, "
        "int64_t lda, const uint8_t* packed, void* c, int64_t ldc, const kiln_gemm::Epilogue* e, int64_t kc) "
        f"{{ kiln_gemm::gemm_quant_bf16_math({quant_shape}, M, a, lda, packed, c, ldc, e, kc); }}",
        # a bfloat16 A (C bfloat16 where the epilogue's out_bf16 says so)
        "void kiln_gemm_quant_bf16_rows(int32_t bits, int64_t M, int64_t N, int64_t K, int64_t group, const kiln_bf16* a, "
        "int64_t lda, const uint8_t* packed, void* c, int64_t ldc, const kiln_gemm::Epilogue* e, int64_t kc) "
        f"{{ kiln_gemm::gemm_quant_bf16_rows({quant_shape}, M, a, lda, packed, c, ldc, e, kc); }}",
        "int32_t kiln_gemm_quant_path_of(int32_t bits, int64_t M, int64_t K, int64_t N, int64_t group) "
        f"{{ return kiln_gemm::quant_path_for({quant_shape}, M); }}",
        # (tests: the int8 digits the digits path carries activations in at these weights; 0: no such path)
        "int32_t kiln_gemm_quant_digits(int32_t bits) { return kiln_gemm::activation_digits(bits); }",
        # (tests: each path at a few rows (kiln_gemm::QuantPath), whichever this CPU takes by default)
        "void kiln_gemm_quant_path(int32_t bits, int32_t path, int64_t M, int64_t N, int64_t K, int64_t group, "
        "const float* a, int64_t lda, const uint8_t* packed, void* c, int64_t ldc, const kiln_gemm::Epilogue* e) { "
        f"if (bits == 8) kiln_gemm::gemm_quant_direct(kiln_gemm::QuantPanels<8>{{{quant_shape}, packed}}, M, a, lda, c, ldc, e, path); "
        f"else kiln_gemm::gemm_quant_direct(kiln_gemm::QuantPanels<4>{{{quant_shape}, packed}}, M, a, lda, c, ldc, e, path); }}",
        # int4 with int8 activations; `integer` 0 takes the float32 path where the integer one applies (tests)
        "void kiln_gemm_quant_a8_f32(int32_t integer, int64_t M, int64_t N, int64_t K, int64_t group, const float* a, "
        "int64_t lda, const uint8_t* packed, void* c, int64_t ldc, const kiln_gemm::Epilogue* e, int64_t kc) "
        "{ const int32_t bits = 4; "
        f"kiln_gemm::gemm_quant_int8_activations({quant_shape}, M, a, lda, packed, c, ldc, e, kc, integer != 0); }}",
        "int32_t kiln_gemm_quant_a8_integer(int64_t M, int64_t K, int64_t N, int64_t group) { const int32_t bits = 4; "
        f"return kiln_gemm::int8_dot_applies({quant_shape}, M); }}",
        # (benchmarks: a decode step's products in one call, and a read of the same pieces of memory)
        "void kiln_gemm_quant_step(int32_t count, int32_t bits, int64_t rows, const int64_t* N, const int64_t* K, "
        "const int64_t* group, const float* const* a, const uint8_t* const* packed, float* const* c, int64_t kc, "
        "double* ns) { kiln_gemm::quant_step(count, bits, rows, N, K, group, a, packed, c, kc, ns); }",
        "void kiln_read_pieces(int32_t count, const uint8_t* const* pieces, const int64_t* bytes, int32_t runs, "
        "int64_t ahead, double* ns) { kiln_gemm::read_pieces(count, pieces, bytes, runs, ahead, ns); }",
    ]
    # kiln's depthwise convolution (include/kiln_depthwise.h) shares the GEMM's vectors and
    # epilogue code, so it lives in this unit.
    lines += [
        "void kiln_depthwise_pack_f32(const float* w, int64_t C, int64_t taps, float* out) "
        "{ kiln_depthwise::pack_weight(w, C, taps, out); }",
        "void kiln_depthwise_f32(const int64_t* d, const float* x, const float* wp, const float* bias, "
        "const float* other, float* y, const kiln_gemm::Epilogue* e) { kiln_depthwise::conv(kiln_depthwise::Shape{"
        "d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13]}, x, wp, bias, other, y, *e); }",
    ]
    # kiln's attention (kiln::attention, kiln/native/src/kiln_runtime.cpp) is built on the GEMM's
    # register tiles; the runtime calls it through this entry.
    lines += [
        "void kiln_attention_f32(const int64_t* shape, const float* q, const float* k, const float* v, "
        "const float* mask, float* out, float scale, int32_t causal) { kiln_attention::Shape z; "
        "std::memcpy(&z, shape, sizeof z); kiln_attention::attention(z, q, k, v, mask, out, scale, causal != 0); }",
    ]
    return "\n".join([*lines, "}"])


def source(defines_flag: bool = True) -> str:
    """The translation unit of kiln's own CPU kernels: the GEMM, the depthwise convolution and
    attention; `defines_flag` False where another unit of the same library defines the index-error
    flag (an exported model's kernels, kiln/deploy/export.py)."""
    return "\n".join([header_text(defines_flag=defines_flag), header_text(("kiln_gemm.h", "kiln_gemm_amx.h", "kiln_gemm_quant.h", "kiln_depthwise.h", "kiln_attention.h")),
                      _entries()])
