"""The shapes and sizes `planner profile-device` measures (`cost_models.profile_device`),
per device: GEMM grids, memory-kernel sizes, SDPA shapes."""

MiB, GiB = 2**20, 2**30

# GPU GEMMs: squares 256..8192 (where efficiency saturates), the four matmuls of a GPT
# block (QKV, attention out, MLP up, MLP down) at 8192 tokens for h = 4096 and 8192, a
# Llama-3-8B MLP (h 4096, ffn 14336), and skinny m (decode-like, small micro-batches).
_BLOCK = [(8192, 3 * h, h) for h in (4096, 8192)] + [(8192, h, h) for h in (4096, 8192)] \
    + [(8192, 4 * h, h) for h in (4096, 8192)] + [(8192, h, 4 * h) for h in (4096, 8192)]
CUDA_GEMM_SHAPES = list(dict.fromkeys(  # in order, each shape once (8192^3 is in both lists)
    [(d, d, d) for d in (256, 512, 1024, 2048, 4096, 8192)] + _BLOCK
    + [(8192, 14336, 4096)] + [(m, 8192, 8192) for m in (1, 16, 128, 1024)]))
# float32 is IEEE FP32 (matmul precision "highest"); tf32 is the same call at "high".
CUDA_GEMM_DTYPES = ("bfloat16", "float16", "float32", "tf32")
# CPU (one thread): float16 left out, torch 2.13's CPU matmul has no fast fp16 path
# (measured here: 2.7 GFLOP/s against 464 for bf16 at 512^3).
# Zoo layers run skinny products (kernel records of bench_kernel_model.py's models): m =
# tokens/samples 1..4096, n, k = widths, channels or (weight grads) tokens 1..512; a log-4
# grid keeps each within 2x of a measured shape per dimension. Shapes under 2^20 FLOPs
# (~10 us at 100 GFLOP/s) time mostly the op's dispatch, charged per op already: left out.
CPU_GEMM_MIN_FLOPS = 2**20
CPU_ZOO_GEMM_SHAPES = [(m, n, k) for m in (2, 8, 32, 128, 512, 2048) for n in (2, 8, 32, 128, 512)
                       for k in (2, 8, 32, 128, 512) if 2 * m * n * k >= CPU_GEMM_MIN_FLOPS]
CPU_GEMM_SHAPES = list(dict.fromkeys(
    [(d, d, d) for d in (64, 128, 256, 512)] + [(256, 768, 256), (256, 256, 1024),
                                                (1, 512, 512), (16, 512, 512)]
    + CPU_ZOO_GEMM_SHAPES))
CPU_GEMM_DTYPES = ("float32", "bfloat16")
# Memory-bound kernels: bytes of the main tensor (GPU: from L2-sized to HBM-sized; the
# H100's L2 is 50 MB, KINDS.md), rows of `ROW_ELEMENTS` for the row-wise kernels.
CUDA_MEMORY_BYTES = (1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB)
# CPU: from a zoo layer's small tensors (tens of KiB, in L1/L2) to past the L3 (32 MiB).
CPU_MEMORY_BYTES = (32 * 2**10, 256 * 2**10, 4 * MiB, 64 * MiB)
ROW_ELEMENTS = 4096  # a hidden size: layer_norm and sum reduce rows this long; softmax too
# batch_norm (training) normalises each of this many channels over a row's positions
# (16 x 256: cnn-small's feature maps, 16 channels of 16 x 16 pixels).
BATCH_NORM_CHANNELS = 16
# Kinds a CPU measures only up to CPU_SMALL_ONLY_MAX_BYTES (the zoo's tensors): profile-
# device must stay under a minute on a busy 2-core host (tests/test_profile_device.py) and
# had no room for them at 64 MiB (11 kinds x 2 passes took 35 s of its 61 at load 11,
# 2026-11-24); past it the last point's rate applies (`kernel_time.memory_gbps`).
CPU_SMALL_ONLY_KINDS = ("softmax_backward", "masked_fill", "short_run", "layer_norm_backward",
                        "broadcast_scalar", "short_reduction", "short_outer",
                        "broadcast_binary", "strided_reduction", "log_softmax_backward",
                        "dropout")
CPU_SMALL_ONLY_MAX_BYTES = 4 * MiB
# masked_fill's probe: a causal mask of this many positions, the zoo's sequence length
# (gpt/llama/t5-tiny train at 32). Its cost per element grows with it on this CPU (one
# thread, 1 MiB of scores, 2026-11-24): 138 us at 32, 188 at 64, 191 at 128.
MASK_SEQ_LEN = 32
# short_run's probe: a copy whose inner loop runs this many elements (llama-tiny's head
# width 8: its permuted and expanded q/k/v copies run inner loops of 8).
SHORT_RUN_PROBE_ELEMENTS = 8
# short_reduction's probe: llama-tiny's repeat_kv backward, the sum over n_rep (this many
# query heads per key head) of a gradient laid out (b, kv_heads, n_rep, s, d) in memory
# (it arrives from attention's (b, heads, s, d)) and read as (b, s, kv_heads, n_rep, d):
# TensorIterator runs the reduced dim innermost, loops of 2 strided by s x d. The other
# dims: llama-tiny's SHORT_REDUCTION_KV_HEADS = 4 key heads, MASK_SEQ_LEN positions,
# SHORT_RUN_PROBE_ELEMENTS head width. Here (one thread, 2026-11-25) 128 KiB of it took
# 39-43 us, a (n, 2, 8) sum over dim 1 of contiguous blocks 31-33, a row sum 3.2; llama's
# two such sums 37 and 50 alone.
SHORT_REDUCTION_PROBE_ELEMENTS = 2
SHORT_REDUCTION_KV_HEADS = 4
# short_outer's probe: a copy in loops of SHORT_RUN_PROBE_ELEMENTS from a stride-0 middle
# dim of this size, so each 2-D loop call runs this many loops (llama-tiny's repeat_kv
# clone: n_rep = 2 query heads per key head; `cost_models.kernel_loops`).
SHORT_OUTER_LOOPS_PER_CALL = 2
# broadcast_binary's probe: x (n, this, SHORT_RUN_PROBE_ELEMENTS) times y (n, 1, ...), y
# broadcast over the middle dim (llama-tiny's rotary k * cos: 4 key heads).
BROADCAST_BINARY_LOOPS_PER_CALL = SHORT_REDUCTION_KV_HEADS
# Per-row probes (`memory_probes.probe_row_seconds`): the same ROW_PROBE_BYTES of fp32
# in rows of ROW_ELEMENTS and in short rows, per row-wise kind: softmax over the zoo's
# attention scores (rows of MASK_SEQ_LEN), layer norm over the zoo's hidden size (64:
# gpt/bert/t5-tiny). Measured here (one thread, thread clock, 2026-11-24): 128 Ki
# elements of softmax took 54 us in rows of 4096 and 94 in rows of 32 (~9.6 ns per
# extra row), layer norm 32 us in rows of 4096 and 72 in rows of 64 (~20 ns per row).
ROW_PROBE_BYTES = 512 * 2**10
# Each row-probe time is the least of this many medians: a shared host only ever slows a
# kernel down (`ir.gemm_table.fastest_points`; two, as the conv probe takes).
ROW_PROBE_PASSES = 2
SHORT_ROW_ELEMENTS = {"softmax": MASK_SEQ_LEN, "layer_norm": 64}
# SDPA shapes (batch, heads, seq_len, head_dim), causal as GPT trains.
CUDA_SDPA_SHAPES = ((8, 16, 1024, 64), (4, 32, 2048, 128), (1, 32, 8192, 128))
CPU_SDPA_SHAPES = ((2, 4, 128, 32), (1, 8, 256, 64))
CUDA_SDPA_DTYPE, CPU_SDPA_DTYPE = "bfloat16", "float32"
# --quick on a GPU: a smoke run of the same code in seconds.
QUICK_CUDA_GEMM_SHAPES = [(1024, 1024, 1024), (4096, 4096, 4096), (16, 4096, 4096)]
# 2-D convolutions (batch, in_channels, out_channels, spatial, kernel), stride 1, same
# padding. CPU: the zoo's (cnn-small: a 3-channel RGB stem and 16-channel 3x3 blocks on
# 16x16 images) at micro-batches 1, 4 and 16 -- oneDNN's time per FLOP is not monotone
# in the batch there (measured here, one thread, 2026-11-24: the stem ran 9.7, 37.9 and
# 53.5 us at batch 1, 4, 16), so each is measured, not interpolated -- and ResNet-50's
# (He et al. 2016, Table 1) 7x7 RGB stem at 112^2 output, 3x3 convs at 56^2 and 14^2, a
# 1x1 expansion at 14^2, at batch 1. GPUs: the same ResNet-50 layers at batch 32.
CPU_CONV_SHAPES = tuple((batch, c_in, 16, 16, 3) for c_in in (3, 16) for batch in (1, 4, 16)) + (
    (1, 3, 64, 112, 7), (1, 64, 64, 56, 3), (1, 256, 256, 14, 3), (1, 256, 1024, 14, 1))
CUDA_CONV_SHAPES = ((32, 3, 64, 112, 7), (32, 64, 64, 56, 3), (32, 128, 128, 28, 3),
                    (32, 256, 256, 14, 3), (32, 512, 512, 7, 3), (32, 256, 1024, 14, 1))
CPU_CONV_DTYPE, CUDA_CONV_DTYPE = "float32", "bfloat16"
