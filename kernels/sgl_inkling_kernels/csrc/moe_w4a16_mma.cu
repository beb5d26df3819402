// Decode MoE on Hopper: NVFP4 routed experts (and BF16 sinks) as W4A16 tensor-core products.
//
// Why CUDA: at batch 1-64 every routed expert has one to a few rows, so the speed is how fast the
// weight bytes stream (0.5625 byte per weight) and how few instructions each weight costs. The
// Triton GEMVs spend ~5.3 instructions per weight (decode, widening to fp32, an fp32 FMA) against
// ~4.4 that 4.3 TB/s allows; here the weights are decoded straight into mma.sync A fragments
// (bf16, block scale folded in by one packed multiply) and the tensor core does the products:
// about 2.7 instructions per weight (counted from the PTX), with later K chunks' loads in flight
// while one computes (a register ring, a cp.async shared-memory ring of chunks, or by default one of
// whole 128-byte row spans, which halves the L2 requests; Nsight Compute at batch 1 finds the chunk
// ring bound by memory latency, not by issue: results/ncu_moe_w4a16_bs1.txt; at batch 64 over 256
// experts the row ring is bound by issue, 75.7% of issue slots and 64.7% of the ALU pipe busy at 58% of
// DRAM, about 4.6 instructions per weight in all: results/ncu_moe_w4a16_bs64_e256.txt).
//
// Swap-AB: out^T[rows, tokens] = W[rows, K] x X^T[K, tokens]; a CTA owns a 16-row tile of one
// expert and up to 8 * NT (token, slot) columns; its warps walk K in interleaved chunks of 128
// elements and sum their partial tiles at the end.
//
// Fragments from the "mma" code layout (nvfp4_layout.py: the checkpoint's bits rearranged inside
// each 4-byte word at load; shapes, rows and scale blocks unchanged). The sum over K does not care in
// which order the k16 steps visit K, so in every chunk thread t (c = t % 4) takes the 32 physical
// elements [32c, 32c + 32) of its two rows (16 code bytes per row: one 16-byte load) and its token
// (64 bytes of activations: four loads). In k16 step j its A elements a0, a1 (logical k 2c, 2c + 1)
// are physical 4j, 4j + 1 and a4, a5 (k 2c + 8, 2c + 9) are 4j + 2, 4j + 3: consecutive pairs, which
// are the activations' own bf16 pairs, so the B fragments are the loaded words as they are. Every
// physical element is used exactly once with its own activation and its own block scale (a thread's
// 32 elements span the two 16-wide scale blocks 2c and 2c + 1 of the chunk).
//
// Decode of a code word (8 codes, 4 bf16 pairs): in the mma layout each pair of codes is one
// rotation, or one multiply of the masked word, away from its bf16 bits (nvfp4_layout.py): a code's
// magnitude bits at a bf16's bits 6-8 and its sign at bit 15 make e2m1 * 2^-126 (a subnormal for
// |v| < 1); one bf16x2 FMA by the block scale * 2^119 makes it e2m1 * scale * 2^-7, exact in bf16;
// the epilogue multiplies by scale2 * 2^7. 8 integer instructions a word, where the checkpoint's
// layout took 14 and a byte permute for each B fragment.
//
// Gate/up (UP): w13 rows are interleaved (2n gate, 2n + 1 up); fragment row g of tile rt reads
// weight row 16 rt + 2g and row g + 8 reads 16 rt + 2g + 1, so a thread holds the gate and the up of
// the same intermediate column and applies SwiGLU with no shuffle.
//
// Buffers and indices are fused_moe_nvfp4's: pairs/block_expert from moe_align(ids, E, 8 * NT);
// act rows are pairs then sinks (n_pairs + s * T + t); out is the [T, k + S, H] fp32 slot buffer.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace {

#ifndef MOE_WARPS
#define MOE_WARPS 4
#endif
constexpr int kWarps = MOE_WARPS;  // warps per CTA: they share one 16-row tile and split its K chunks
constexpr int kChunk = 128;   // K elements per chunk: 8 k16 steps

struct Blocks {
  const int64_t* pairs;        // [blocks * BM] flat pair index, n_pairs = padding
  const int64_t* block_expert; // [blocks] routed expert or -1
  const float* gam;            // [T, S] sink weights (down), fp32
  const float* weights;        // [T * k] routing weights (down), fp32
  int64_t s_gt;
  int n_pairs, T, topk, n_sink_blocks, block_lo;
  int pdl;  // this call's launches as programmatic dependents (MOE_PDL builds; the batch's choice)
};

__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

template <int S>
__device__ __forceinline__ uint32_t rotr(uint32_t w) {
  uint32_t d;
  asm("shf.r.wrap.b32 %0, %1, %1, %2;" : "=r"(d) : "r"(w), "n"(S));
  return d;
}

// Bf16 pair p (elements 2p, 2p + 1) of an mma-layout code word, scaled by s2 (nvfp4_layout.py).
__device__ __forceinline__ uint32_t decode_pair(uint32_t w, int p, uint32_t s2) {
  constexpr uint32_t kLanes = 0x81C081C0u;  // magnitude bits 6-8 and the sign bit 15 of both lanes
  const uint32_t t = p == 0 ? w : p == 1 ? rotr<3>(w) : p == 2 ? rotr<6>(w) : (w & 0x001B001Bu) * 0x4108u;
  return fma_bf16x2(t & kLanes, s2);
}

// fp8 e4m3 block scales (two adjacent bytes) -> bf16x2 (s * 2^119, s * 2^119) for each.
__device__ __forceinline__ void scale_pairs(uint16_t two, uint32_t& s_a, uint32_t& s_b) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const float k = 6.646139978924579e35f;  // 2^119
  __nv_bfloat162 a = __floats2bfloat162_rn(f.x * k, f.x * k);
  __nv_bfloat162 b = __floats2bfloat162_rn(f.y * k, f.y * k);
  s_a = *reinterpret_cast<uint32_t*>(&a);
  s_b = *reinterpret_cast<uint32_t*>(&b);
}

__device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#ifndef MOE_L2_PREFETCH
#define MOE_L2_PREFETCH 256
#endif

// Weights stream once: not kept in L1, and (MOE_L2_PREFETCH) the L2 asked to fetch the whole 256-byte
// (or 128-byte) span a load falls in, so that the DRAM sees long runs of each row.
__device__ __forceinline__ uint4 ldg(const void* p) {
  uint4 v;
#if MOE_L2_PREFETCH == 256
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#elif MOE_L2_PREFETCH == 128
  asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
  v = __ldg(reinterpret_cast<const uint4*>(p));
#endif
  return v;
}

#ifndef MOE_PDL  // programmatic dependent launch of the down projection (Hopper; see pdl_wait)
#define MOE_PDL 0
#endif

// With MOE_PDL the down launch may start while the gate/up launch's last CTAs still run: its CTAs
// issue their first weight loads (which depend on nothing the gate/up launch writes: the routing
// was computed before it) and only then wait for the gate/up grid's activations. That overlaps the
// up launch's tail and the launch gap with weight streaming. Where a call asks for it (Blocks::pdl)
// every kernel lets its dependents launch as soon as it starts and the down launch carries the
// attribute; otherwise neither, and the wait passes at once (a kernel launched without the attribute).
__device__ __forceinline__ void pdl_wait() {
#if MOE_PDL
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#ifndef MOE_CP_ASYNC  // stages of a per-warp shared-memory ring for the NVFP4 code stream (0: registers)
#define MOE_CP_ASYNC 0
#endif

// (maybe_unused: a build whose FP4 stream takes another path references neither of these two)
// (_at: the shared-memory destination as its 32-bit address)
[[maybe_unused]] __device__ __forceinline__ void cp_async16_at(uint32_t d, const void* src) {
#if MOE_L2_PREFETCH == 256
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(src));
#elif MOE_L2_PREFETCH == 128
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(d), "l"(src));
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
#endif
}

[[maybe_unused]] __device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  cp_async16_at(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src);
}

[[maybe_unused]] __device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// One chunk's weight registers: FP4 two 16-byte code segments + four scale bytes; BF16 eight loads.
template <bool FP4>
struct WChunk {
  uint4 w[FP4 ? 2 : 8];
  uint16_t s[2];
};

template <bool FP4>
__device__ __forceinline__ void load_chunk(WChunk<FP4>& c, const uint8_t* r0, const uint8_t* r1,
                                           const uint8_t* s0, const uint8_t* s1, int ch, int lane4) {
  if constexpr (FP4) {
    c.w[0] = ldg(r0 + ch * 64 + lane4 * 16);
    c.w[1] = ldg(r1 + ch * 64 + lane4 * 16);
    c.s[0] = __ldg(reinterpret_cast<const uint16_t*>(s0 + ch * 8 + lane4 * 2));
    c.s[1] = __ldg(reinterpret_cast<const uint16_t*>(s1 + ch * 8 + lane4 * 2));
  } else {
    const int off = (ch * kChunk + lane4 * 32) * 2;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      c.w[q] = ldg(r0 + off + q * 16);
      c.w[4 + q] = ldg(r1 + off + q * 16);
    }
  }
}

// The cp.async chunk ring of a warp: stage st gets chunk ch of rows r0, r1 (16 code bytes per lane)
// and their scale bytes (4-byte copies by even lanes, two lanes' pairs each); ring_chunk reads a
// stage back once its copies have landed, the __syncwarps because lanes read scale words other
// lanes copied, and before the stage is refilled.
template <int S>
__device__ __forceinline__ void ring_fill(uint4 (&ring)[kWarps][S][2][32], uint32_t (&sring)[kWarps][S][2][16],
                                          int warp, int st, int g, int lane4, const uint8_t* r0, const uint8_t* r1,
                                          const uint8_t* sc0, const uint8_t* sc1, int ch) {
  const int sw = g * 2 + (lane4 >> 1);
  cp_async16(&ring[warp][st][0][g * 4 + lane4], r0 + ch * 64 + lane4 * 16);
  cp_async16(&ring[warp][st][1][g * 4 + lane4], r1 + ch * 64 + lane4 * 16);
  if ((lane4 & 1) == 0) {
    cp_async4(&sring[warp][st][0][sw], sc0 + ch * 8 + lane4 * 2);
    cp_async4(&sring[warp][st][1][sw], sc1 + ch * 8 + lane4 * 2);
  }
}

template <int S>
__device__ __forceinline__ WChunk<true> ring_chunk(const uint4 (&ring)[kWarps][S][2][32],
                                                   const uint32_t (&sring)[kWarps][S][2][16], int warp, int st,
                                                   int g, int lane4) {
  const int sw = g * 2 + (lane4 >> 1), sh = (lane4 & 1) * 16;
  cp_async_wait<S - 2>();
  __syncwarp();
  WChunk<true> c;
  c.w[0] = ring[warp][st][0][g * 4 + lane4];
  c.w[1] = ring[warp][st][1][g * 4 + lane4];
  c.s[0] = static_cast<uint16_t>(sring[warp][st][0][sw] >> sh);
  c.s[1] = static_cast<uint16_t>(sring[warp][st][1][sw] >> sh);
  __syncwarp();
  return c;
}

#ifndef MOE_DUAL_ACC
#define MOE_DUAL_ACC 0
#endif
#ifndef MOE_X_PREFETCH  // one column tile: load the next chunk's activations while this one computes
#define MOE_X_PREFETCH 0
#endif
static_assert(!(MOE_X_PREFETCH && MOE_CP_ASYNC), "the activation prefetch is for the register ring only");

// acc2: the odd k16 steps' accumulator when MOE_DUAL_ACC (two independent mma chains per chunk).
template <bool FP4>
__device__ __forceinline__ void a_fragment(const WChunk<FP4>& c, int j, uint32_t sa0, uint32_t sb0, uint32_t sa1,
                                           uint32_t sb1, uint32_t (&a)[4]) {
  if constexpr (FP4) {  // step j: pairs 0, 1 (j even) or 2, 3 (j odd) of code word j / 2 of each row
    const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&c.w[0]);
    const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&c.w[1]);
    const uint32_t s0 = j < 4 ? sa0 : sb0, s1 = j < 4 ? sa1 : sb1;
    const int p = 2 * (j & 1);
    a[0] = decode_pair(w0[j >> 1], p, s0);
    a[2] = decode_pair(w0[j >> 1], p + 1, s0);
    a[1] = decode_pair(w1[j >> 1], p, s1);
    a[3] = decode_pair(w1[j >> 1], p + 1, s1);
  } else {  // bf16 words 2j, 2j + 1 of each row's 32 elements
    const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&c.w[0]);
    const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&c.w[4]);
    a[0] = w0[2 * j];
    a[2] = w0[2 * j + 1];
    a[1] = w1[2 * j];
    a[3] = w1[2 * j + 1];
  }
}

// A thread's 32 activations of column i in this chunk (16 words), zero for an invalid column.
__device__ __forceinline__ void load_x(const __nv_bfloat16* row, bool ok, int ch, int lane4, uint32_t (&xv)[16]) {
  const uint4* p = reinterpret_cast<const uint4*>(row + ch * kChunk + lane4 * 32);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 v = ok ? __ldg(p + q) : make_uint4(0, 0, 0, 0);
    xv[4 * q] = v.x;
    xv[4 * q + 1] = v.y;
    xv[4 * q + 2] = v.z;
    xv[4 * q + 3] = v.w;
  }
}

// One chunk's products. Up to 2 column tiles: activations first, then per k16 step one A fragment
// for every tile. More tiles: the 8 A fragments first (32 registers), then the tiles one by one, so
// that registers hold one tile's activations instead of all of them.
// XPRE: one column tile whose activations the caller loaded (xpre).
template <bool FP4, int NT, bool XPRE = MOE_X_PREFETCH && NT == 1>
__device__ __forceinline__ void compute_chunk(float (&acc)[NT][4], float (&acc2)[NT][4], const WChunk<FP4>& c,
                                              const __nv_bfloat16* const (&xrow)[NT], const bool (&xok)[NT],
                                              int ch, int lane4, const uint32_t (&xpre)[16]) {
  uint32_t sa0 = 0, sb0 = 0, sa1 = 0, sb1 = 0;  // row 0 / row 1 scales of blocks 2c, 2c + 1
  if constexpr (FP4) {
    scale_pairs(c.s[0], sa0, sb0);
    scale_pairs(c.s[1], sa1, sb1);
  }
  if constexpr (NT <= 2) {
    uint32_t xv[NT][16];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      if (XPRE && NT == 1) {
#pragma unroll
        for (int q = 0; q < 16; ++q) xv[i][q] = xpre[q];
      } else {
        load_x(xrow[i], xok[i], ch, lane4, xv[i]);
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t a[4];
      a_fragment<FP4>(c, j, sa0, sb0, sa1, sb1, a);
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        mma((MOE_DUAL_ACC && (j & 1)) ? acc2[i] : acc[i], a, xv[i][2 * j], xv[i][2 * j + 1]);
      }
    }
  } else {
    uint32_t a[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) a_fragment<FP4>(c, j, sa0, sb0, sa1, sb1, a[j]);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      uint32_t xv[16];
      load_x(xrow[i], xok[i], ch, lane4, xv);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mma(acc[i], a[j], xv[2 * j], xv[2 * j + 1]);
      }
    }
  }
}

// Column n of the block: its x / act row, validity, token, slot and sink index (-1 routed).
struct Col {
  int64_t in_row, act_row;
  int tok, slot;
  bool ok;
};

__device__ __forceinline__ Col column(const Blocks& b, int blk, int n, int bm, bool up, bool sink, int s) {
  Col c;
  if (sink) {
    const int tb = (b.T + bm - 1) / bm;
    const int tok = (blk % tb) * bm + n;
    c.ok = tok < b.T;
    c.tok = c.ok ? tok : 0;
    c.act_row = b.n_pairs + (int64_t)s * b.T + c.tok;
    c.in_row = up ? c.tok : c.act_row;
    c.slot = b.topk + s;
  } else {
    const int64_t pair = b.pairs[(int64_t)(blk - b.n_sink_blocks) * bm + n];
    c.ok = pair < b.n_pairs;
    const int p = c.ok ? static_cast<int>(pair) : 0;  // < n_pairs, an int: 32-bit division, not 64
    c.tok = p / b.topk;
    c.slot = p % b.topk;
    c.act_row = p;
    c.in_row = up ? c.tok : p;
  }
  return c;
}

// UP: in = x [T, K] -> act rows (silu(gate) * up), codes = w13. DOWN: in = act -> out slots, codes = w2.
struct Args {
  const __nv_bfloat16* in;
  const uint8_t *codes, *scales, *sink_w;
  const float* scale2;
  __nv_bfloat16* act;
  float* out;
  int64_t s_in, s_ce, s_cr, s_se, s_sr, s_we, s_wr, s_at, s_ot, s_os;
  int n_rows, K;
};

// A tile's start: this thread's B column (g) of every column tile of block blk, its input row and
// whether it is a real column, and zeroed accumulators. A padding column's row is the block's first
// column's (always real in a block that runs), so the lean loop, which loads activations without
// predicates, reads no row beyond the block's own: at batch 64 (about 1.5 real columns a block)
// reading row 0 as well cost 4% of the MoE's time (H200 at 7f29064: 2092.7 us against 2178.6, batch 8
// 417.8 against 438.3). Its products reach only its own outputs, which finish_tile never writes.
template <int NT>
__device__ __forceinline__ void start_tile(const Args& a, const Blocks& b, int blk, int g, bool up, bool sink, int s,
                                           const __nv_bfloat16* (&xrow)[NT], bool (&xok)[NT], float (&acc)[NT][4],
                                           float (&acc2)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    Col c = column(b, blk, 8 * i + g, 8 * NT, up, sink, s);
    xok[i] = c.ok;
    if (!c.ok) c = column(b, blk, 0, 8 * NT, up, sink, s);
    xrow[i] = a.in + c.in_row * a.s_in;
  }
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[i][q] = acc2[i][q] = 0.f;
}

// The end of a tile: the warps' partial products summed in a fixed order (deterministic), then
// warp 0 writes the tile (SwiGLU into act rows, or weighted into the out slots); the other warps
// return at once. Every thread of the CTA calls it (one __syncthreads).
template <bool FP4, int NT, bool UP>
__device__ __forceinline__ void finish_tile(const Args& a, const Blocks& b, int blk, int rt, int warp, int g,
                                            int lane4, int e, int s, float (&acc)[NT][4], float (&acc2)[NT][4],
                                            float (*red)[NT * 4][32]) {
  constexpr int BM = 8 * NT;
  const bool sink = !FP4;
  const int row0 = UP ? rt * 16 + 2 * g : rt * 16 + g;
  const int row1 = UP ? row0 + 1 : row0 + 8;
  if (MOE_DUAL_ACC) {
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][q] += acc2[i][q];
  }
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[warp - 1][i * 4 + q][g * 4 + lane4] = acc[i][q];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w)
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][q] += red[w][i * 4 + q][g * 4 + lane4];

  const float post = FP4 ? a.scale2[e] * 128.f : 1.f;  // scale2 and the decode's 2^-7
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // C columns of this thread: 2 * lane4 + h
      const Col c = column(b, blk, 8 * i + 2 * lane4 + h, BM, UP, sink, s);
      if (!c.ok) continue;
      if constexpr (UP) {
        const float gt = acc[i][h] * post, u = acc[i][2 + h] * post;
        a.act[c.act_row * a.s_at + rt * 8 + g] = __float2bfloat16(gt / (1.f + __expf(-gt)) * u);
      } else {
        const float gate = sink ? b.gam[(int64_t)c.tok * b.s_gt + s] : b.weights[c.act_row];
        float* o = a.out + (int64_t)c.tok * a.s_ot + (int64_t)c.slot * a.s_os;
        o[row0] = acc[i][h] * post * gate;
        o[row1] = acc[i][2 + h] * post * gate;
      }
    }
  }
}


#ifndef MOE_ROW_RING  // super-stages of a per-warp ring that copies whole 128-byte row spans (0: off)
#define MOE_ROW_RING 0
#endif

#if MOE_ROW_RING
// The row ring: a warp's stage is two adjacent chunks (K 256: 128 code bytes per row) of its tile's 16
// rows, copied so that each cp.async instruction covers 4 rows x 128 contiguous bytes (4 L2 requests
// of whole lines, where the chunk ring's covers 8 rows x 64 bytes: 8 half-line requests for the same
// bytes). Consumers read their 16-byte segments back from rows 128 bytes apart; the 16-byte unit
// index is XOR-swizzled by a row bit so that the 8 lanes of each quarter-warp hit distinct banks.
// An odd chunk count (e.g. I = 384 under TP 8) ends in a half stage; scale rows are then only 8-byte
// aligned, so the scales come in 8-byte copies.
constexpr int kRowSpan = 2;  // chunks per row-ring stage

__device__ __forceinline__ int row_swz(int lr) { return ((lr ^ (lr >> 1)) & 1) << 2; }

[[maybe_unused]] __device__ __forceinline__ void cp_async8_at(uint32_t d, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src));
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  cp_async8_at(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src);
}

template <int S>
__device__ __forceinline__ void row_fill(uint4 (&ring)[kWarps][S][16][8], uint2 (&sc)[kWarps][S][16][2], int warp,
                                         int st, int lane, const uint8_t* codes, int64_t s_cr, const uint8_t* scales,
                                         int64_t s_sr, int sp, bool full) {
  const int u = lane & 7;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int lr = 4 * i + (lane >> 3);
    if (full || u < 4) cp_async16(&ring[warp][st][lr][u ^ row_swz(lr)], codes + lr * s_cr + sp * 128 + u * 16);
  }
  if (full || (lane & 1) == 0)
    cp_async8(&sc[warp][st][lane >> 1][lane & 1], scales + (lane >> 1) * s_sr + sp * 16 + (lane & 1) * 8);
}

// Chunk c (0, 1) of stage st for the thread's rows lr0, lr1 (as load_chunk would load it).
template <int S>
__device__ __forceinline__ WChunk<true> row_chunk(const uint4 (&ring)[kWarps][S][16][8],
                                                  const uint2 (&sc)[kWarps][S][16][2], int warp, int st, int c,
                                                  int lr0, int lr1, int lane4) {
  WChunk<true> w;
  const int u = c * 4 + lane4;
  w.w[0] = ring[warp][st][lr0][u ^ row_swz(lr0)];
  w.w[1] = ring[warp][st][lr1][u ^ row_swz(lr1)];
  w.s[0] = reinterpret_cast<const uint16_t*>(&sc[warp][st][lr0][0])[u];
  w.s[1] = reinterpret_cast<const uint16_t*>(&sc[warp][st][lr1][0])[u];
  return w;
}

#ifndef MOE_LEAN  // row ring, one column tile: the stage loop with its addresses hoisted (row_ring_lean)
#define MOE_LEAN 0
#endif

// A value the compiler must keep in a register: it can no longer recompute it from what it was
// computed from (without this, ptxas rematerialises every hoisted address inside the loop). These
// helpers serve row_ring_lean alone (maybe_unused: builds without it reference none of them).
[[maybe_unused]] __device__ __forceinline__ uint32_t opaque(uint32_t v) {
  asm volatile("mov.b32 %0, %0;" : "+r"(v));
  return v;
}

template <typename T>
[[maybe_unused]] __device__ __forceinline__ const T* opaque(const T* p) {
  asm volatile("mov.b64 %0, %0;" : "+l"(p));
  return p;
}

// Shared-memory reads at a 32-bit address; volatile so that they stay between the __syncwarps.
[[maybe_unused]] __device__ __forceinline__ uint4 lds128(uint32_t at) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(at));
  return v;
}

[[maybe_unused]] __device__ __forceinline__ uint16_t lds16(uint32_t at) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(at));
  return v;
}

// The row ring of one column tile with the bookkeeping of a stage taken out of the loop: the decode
// kernel is bound by instruction issue (results/ncu_moe_w4a16_bs64_e256.txt: 75.7% of issue slots
// busy, about 250 instructions a 128-element chunk of which some 75 computed ring slots, swizzles,
// source rows, predicates and zeroed activations anew each stage). Here every lane's source pointers,
// shared-memory slots and read offsets are set once; a stage adds the slot's offset and advances the
// pointers. The activations are loaded for the whole stage without predicates: a padding column
// reads its block's first column's row (start_tile), and a column's products only reach its own
// outputs, which finish_tile never writes for padding. Same copies, same order of products as row_ring_products.
// RT 2 (tile_pair): the warp's stage holds two 16-row tiles, 32 rows, whose products share each chunk's
// activation loads (acc[t]: tile t's accumulators).
template <int S, bool UP, int RT>
__device__ __forceinline__ void row_ring_lean(uint4 (&ring)[kWarps][S][16 * RT][8], uint2 (&sc)[kWarps][S][16 * RT][2],
                                              const uint8_t* codes, int64_t s_cr, const uint8_t* scales,
                                              int64_t s_sr, int n_chunks, int warp, int lane, int g, int lane4,
                                              const __nv_bfloat16* xrow, float (&acc)[RT][1][4],
                                              float (&acc2)[RT][1][4]) {
  constexpr int kStage = 16 * RT * 8 * 16, kScStage = 16 * RT * 2 * 8;  // bytes of a code / scale stage
  const int n_stages = (n_chunks + kRowSpan - 1) / kRowSpan;
  // Copies (row_fill's): unit u of rows 4q + r, q = 0..3 (whose swizzle is r's: rows 4 apart share
  // it, so the four destinations are 512 bytes apart), and 8 scale bytes of row lane / 2.
  const int u = lane & 7, r = lane >> 3;
  const uint8_t* src = opaque(codes + r * s_cr + u * 16 + warp * 128);  // the warp's first stage, sp = warp
  const int64_t row4 = 4 * s_cr;
  const uint8_t* ssrc = opaque(scales + (lane >> 1) * s_sr + (lane & 1) * 8 + warp * 16);
  const uint32_t dst = opaque(static_cast<uint32_t>(__cvta_generic_to_shared(&ring[warp][0][r][u ^ row_swz(r)])));
  const uint32_t sdst = opaque(static_cast<uint32_t>(__cvta_generic_to_shared(&sc[warp][0][lane >> 1][lane & 1])));
  const bool copy_half = u < 4, scale_half = (lane & 1) == 0;  // the lanes of a half last stage
  int issued = 0;  // the warp's stages issued so far (stage i is sp = warp + kWarps * i, slot i % S)
  auto issue = [&]() {
    const int sp = warp + kWarps * issued;
    if (sp < n_stages) {
      const bool full = 2 * sp + 1 < n_chunks;
      const uint32_t slot = issued % S;
      if (full || copy_half) {
        const uint32_t d = dst + slot * kStage;
#pragma unroll
        for (int q = 0; q < 4 * RT; ++q) cp_async16_at(d + 512 * q, src + q * row4);
      }
      if (full || scale_half) {
#pragma unroll
        for (int t = 0; t < RT; ++t) cp_async8_at(sdst + slot * kScStage + 256 * t, ssrc + 16 * t * s_sr);
      }
    }
    cp_async_commit();
    ++issued;
    src += kWarps * 128;
    ssrc += kWarps * 16;
  };
#pragma unroll
  for (int st = 0; st < S - 1; ++st) issue();
  // Reads (row_chunk's): chunk c's unit c * 4 + lane4 of rows lr0, lr1, and their scale pairs (chunk 1's
  // 8 bytes after chunk 0's); tile t's rows 16 t further (a constant offset of each read).
  const int lr0 = UP ? 2 * g : g, lr1 = UP ? 2 * g + 1 : g + 8;
  const uint32_t ring_at = static_cast<uint32_t>(__cvta_generic_to_shared(&ring[warp][0][0][0]));
  const uint32_t sc_at = static_cast<uint32_t>(__cvta_generic_to_shared(&sc[warp][0][0][0]));
  uint32_t rd[2][2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    rd[c][0] = opaque(ring_at + lr0 * 128 + ((c * 4 + lane4) ^ row_swz(lr0)) * 16);
    rd[c][1] = opaque(ring_at + lr1 * 128 + ((c * 4 + lane4) ^ row_swz(lr1)) * 16);
  }
  const uint32_t rs0 = opaque(sc_at + lr0 * 16 + lane4 * 2), rs1 = opaque(sc_at + lr1 * 16 + lane4 * 2);
  pdl_wait();  // the activations below come from the previous launch
  const __nv_bfloat16* xp = opaque(xrow + warp * 2 * kChunk + lane4 * 32);  // chunk 2 sp of the warp's first stage
  const __nv_bfloat16* const xr[1] = {xrow};
  const bool ok[1] = {true};
  for (int i = 0; warp + kWarps * i < n_stages; ++i) {
    const int sp = warp + kWarps * i;
    const bool full = 2 * sp + 1 < n_chunks;
    uint32_t xv[2][16];  // chunk 1's only where it exists: its products are skipped otherwise
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (c == 0 || full) {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(xp + c * kChunk) + q);
          xv[c][4 * q] = v.x;
          xv[c][4 * q + 1] = v.y;
          xv[c][4 * q + 2] = v.z;
          xv[c][4 * q + 3] = v.w;
        }
      }
    xp += kWarps * 2 * kChunk;
    const uint32_t so = (i % S) * kStage, sso = (i % S) * kScStage;
    cp_async_wait<S - 2>();
    __syncwarp();  // lanes read rows other lanes copied
    WChunk<true> ch[RT][2];
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        ch[t][c].w[0] = lds128(rd[c][0] + so + 2048 * t);
        ch[t][c].w[1] = lds128(rd[c][1] + so + 2048 * t);
        ch[t][c].s[0] = lds16(rs0 + sso + 8 * c + 256 * t);
        ch[t][c].s[1] = lds16(rs1 + sso + 8 * c + 256 * t);
      }
    __syncwarp();  // before the stage is refilled
    issue();
#pragma unroll
    for (int t = 0; t < RT; ++t) compute_chunk<true, 1, true>(acc[t], acc2[t], ch[t][0], xr, ok, kRowSpan * sp, lane4, xv[0]);
    if (full) {
#pragma unroll
      for (int t = 0; t < RT; ++t)
        compute_chunk<true, 1, true>(acc[t], acc2[t], ch[t][1], xr, ok, kRowSpan * sp + 1, lane4, xv[1]);
    }
  }
  cp_async_wait<0>();
}

// A routed tile's products through the row ring: the CTA's warps take stages (2 chunks) in turn, each
// keeping S - 1 stages in flight. codes / scales point at the tile's first row.
template <int NT, bool UP>
__device__ __forceinline__ void row_ring_products(const uint8_t* codes, int64_t s_cr, const uint8_t* scales,
                                                  int64_t s_sr, int n_chunks, int warp, int lane, int g, int lane4,
                                                  const __nv_bfloat16* const (&xrow)[NT], const bool (&xok)[NT],
                                                  float (&acc)[NT][4], float (&acc2)[NT][4]) {
  // As deep as asked, within the 48 KB of static shared memory beside finish_tile's reduction buffer.
  constexpr int kFit = (48 * 1024 - (kWarps - 1) * NT * 4 * 32 * 4) / (kWarps * (16 * 8 + 16) * 16);
  constexpr int kWant = MOE_ROW_RING > 2 ? MOE_ROW_RING : 2;
  constexpr int S = kWant < kFit ? kWant : kFit;
  static_assert(S >= 2, "the row ring needs two stages");
  __shared__ uint4 ring[kWarps][S][16][8];
  __shared__ uint2 sc[kWarps][S][16][2];
  if constexpr (NT == 1 && MOE_LEAN) {
    row_ring_lean<S, UP, 1>(ring, sc, codes, s_cr, scales, s_sr, n_chunks, warp, lane, g, lane4, xrow[0],
                            reinterpret_cast<float(&)[1][1][4]>(acc), reinterpret_cast<float(&)[1][1][4]>(acc2));
    return;
  }
  const int n_stages = (n_chunks + kRowSpan - 1) / kRowSpan;
  const int lr0 = UP ? 2 * g : g, lr1 = UP ? 2 * g + 1 : g + 8;
  auto issue = [&](int sp, int st) {
    if (sp < n_stages) row_fill<S>(ring, sc, warp, st, lane, codes, s_cr, scales, s_sr, sp, 2 * sp + 1 < n_chunks);
    cp_async_commit();
  };
#pragma unroll
  for (int st = 0; st < S - 1; ++st) issue(warp + kWarps * st, st);
  pdl_wait();  // the activations below come from the previous launch
  uint32_t xnone[16] = {};
  for (int i = 0; warp + kWarps * i < n_stages; ++i) {
    const int sp = warp + kWarps * i, st = i % S;
    cp_async_wait<S - 2>();
    __syncwarp();  // lanes read rows other lanes copied
    const bool full = 2 * sp + 1 < n_chunks;
    const WChunk<true> c0 = row_chunk<S>(ring, sc, warp, st, 0, lr0, lr1, lane4);
    WChunk<true> c1;
    if (full) c1 = row_chunk<S>(ring, sc, warp, st, 1, lr0, lr1, lane4);
    __syncwarp();  // before the stage is refilled
    issue(sp + kWarps * (S - 1), (i + S - 1) % S);
    compute_chunk<true, NT>(acc, acc2, c0, xrow, xok, kRowSpan * sp, lane4, xnone);
    if (full) compute_chunk<true, NT>(acc, acc2, c1, xrow, xok, kRowSpan * sp + 1, lane4, xnone);
  }
  cp_async_wait<0>();
}
#endif

// One warp's 16-row tile of block blk: FP4 a routed block, else a BF16 sink block.
template <bool FP4, int NT, bool UP, int DEPTH>
__device__ __forceinline__ void tile(const Args& a, const Blocks& b, int blk, int rt, int warp, int g, int lane4,
                                     float (*red)[NT * 4][32]) {
  constexpr int BM = 8 * NT;
  const bool sink = !FP4;
  const int K = a.K;
  int s = 0, e = -1;
  if (sink) {
    s = blk / ((b.T + BM - 1) / BM);
  } else {
    e = (int)b.block_expert[blk - b.n_sink_blocks];
    if (e < 0) return;  // past the last real block (the grid is sized for the worst case)
  }
  const int row0 = UP ? rt * 16 + 2 * g : rt * 16 + g;
  const int row1 = UP ? row0 + 1 : row0 + 8;
  const uint8_t *r0, *r1, *sc0 = nullptr, *sc1 = nullptr;
  if constexpr (FP4) {
    r0 = a.codes + e * a.s_ce + row0 * a.s_cr;
    r1 = a.codes + e * a.s_ce + row1 * a.s_cr;
    sc0 = a.scales + e * a.s_se + row0 * a.s_sr;
    sc1 = a.scales + e * a.s_se + row1 * a.s_sr;
  } else {
    r0 = a.sink_w + (s * a.s_we + row0 * a.s_wr) * 2;
    r1 = a.sink_w + (s * a.s_we + row1 * a.s_wr) * 2;
  }
  const __nv_bfloat16* xrow[NT];
  bool xok[NT];
  float acc[NT][4], acc2[NT][4];
  start_tile<NT>(a, b, blk, g, UP, sink, s, xrow, xok, acc, acc2);

  // The CTA's warps take the chunks in turn (warp w: chunks w, w + kWarps, ...), so that at any time
  // kWarps * DEPTH adjacent chunks of every row are requested together: DRAM pages are read in long
  // runs instead of 64-byte pieces at different times. Each warp keeps DEPTH of its chunks in flight:
  // while one computes, the loads of the next DEPTH are issued (a BF16 chunk is 4x the bytes and
  // registers of an NVFP4 one: one is in flight).
  const int n_chunks = K / kChunk;
  if constexpr (FP4 && MOE_ROW_RING) {
#if MOE_ROW_RING
    row_ring_products<NT, UP>(a.codes + e * a.s_ce + rt * 16 * a.s_cr, a.s_cr, a.scales + e * a.s_se + rt * 16 * a.s_sr,
                              a.s_sr, n_chunks, warp, g * 4 + lane4, g, lane4, xrow, xok, acc, acc2);
#endif
  } else if constexpr (FP4 && MOE_CP_ASYNC > 0) {
    // The same chunk order through a per-warp ring of S shared-memory stages filled by cp.async:
    // S - 1 chunks in flight for the cost of one chunk's registers. A lane reads back its own code
    // segments; the scales come in 4-byte copies by even lanes (two lanes' pairs), hence the
    // __syncwarp after each wait and before a stage is refilled.
    constexpr int S = MOE_CP_ASYNC > 2 ? MOE_CP_ASYNC : 2;  // at least 2 (one stage filling, one read)
    __shared__ uint4 ring[kWarps][S][2][32];
    __shared__ uint32_t sring[kWarps][S][2][16];
    auto issue = [&](int ch, int st) {
      if (ch < n_chunks) ring_fill<S>(ring, sring, warp, st, g, lane4, r0, r1, sc0, sc1, ch);
      cp_async_commit();
    };
#pragma unroll
    for (int st = 0; st < S - 1; ++st) issue(warp + kWarps * st, st);
    pdl_wait();  // the activations below come from the previous launch
    uint32_t xnone[16] = {};
    for (int i = 0; warp + kWarps * i < n_chunks; ++i) {
      const int ch = warp + kWarps * i, st = i % S;
      const WChunk<true> c = ring_chunk<S>(ring, sring, warp, st, g, lane4);
      issue(ch + kWarps * (S - 1), (i + S - 1) % S);
      compute_chunk<true, NT>(acc, acc2, c, xrow, xok, ch, lane4, xnone);
    }
    cp_async_wait<0>();
  } else {
  constexpr int D = FP4 ? DEPTH : 1;
  WChunk<FP4> buf[D];
#pragma unroll
  for (int d = 0; d < D; ++d) {
    const int ch = warp + kWarps * d;
    if (ch < n_chunks) load_chunk<FP4>(buf[d], r0, r1, sc0, sc1, ch, lane4);
  }
  uint32_t xpre[16] = {};
  pdl_wait();  // the activations below come from the previous launch
  if (MOE_X_PREFETCH && NT == 1 && warp < n_chunks) load_x(xrow[0], xok[0], warp, lane4, xpre);
  for (int i0 = 0; warp + kWarps * i0 < n_chunks; i0 += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int ch = warp + kWarps * (i0 + d);
      if (ch < n_chunks) {
        const WChunk<FP4> c = buf[d];
        const int nx = ch + kWarps * D;
        if (nx < n_chunks) load_chunk<FP4>(buf[d], r0, r1, sc0, sc1, nx, lane4);
        uint32_t xnext[16] = {};
        if (MOE_X_PREFETCH && NT == 1 && ch + kWarps < n_chunks) load_x(xrow[0], xok[0], ch + kWarps, lane4, xnext);
        compute_chunk<FP4, NT>(acc, acc2, c, xrow, xok, ch, lane4, xpre);
#pragma unroll
        for (int q = 0; q < 16; ++q) xpre[q] = xnext[q];
      }
    }
  }
  }
  finish_tile<FP4, NT, UP>(a, b, blk, rt, warp, g, lane4, e, s, acc, acc2, red);
}

#if MOE_ROW_RING && MOE_LEAN
// Row tiles rt and rt + 1 of routed block blk in one CTA (the lean row ring's stages 32 rows deep): the
// block's activations are loaded once for both tiles, halving the activation bytes a weight byte costs
// the L1 and L2 where a block has few real columns (at batch 64 over 256 experts about 1.5 of 8: the
// routed launches there were at 92% of L2 and 88% of L1 throughput with DRAM at 75%, Nsight Compute
// at 957bcda, results/diagnostics/moe_x_ahead_7f29064). Half the CTAs, each with twice the work: for
// batches with many blocks (moe_w4a16_cuda.row_tiles).
template <bool UP>
__device__ __forceinline__ void tile_pair(const Args& a, const Blocks& b, int blk, int rt, int warp, int g,
                                          int lane4) {
  __shared__ float red[2][kWarps > 1 ? kWarps - 1 : 1][4][32];
  constexpr int kFit = (48 * 1024 - 2 * (kWarps - 1) * 4 * 32 * 4) / (kWarps * 2 * (16 * 8 + 16) * 16);
  constexpr int kWant = MOE_ROW_RING > 2 ? MOE_ROW_RING : 2;
  constexpr int S = kWant < kFit ? kWant : kFit;
  static_assert(S >= 2, "the row ring needs two stages");
  __shared__ uint4 ring[kWarps][S][32][8];
  __shared__ uint2 sc[kWarps][S][32][2];
  const int e = (int)b.block_expert[blk - b.n_sink_blocks];
  if (e < 0) return;  // past the last real block (the grid is sized for the worst case)
  const __nv_bfloat16* xrow[1];
  bool xok[1];
  float acc[2][1][4], acc2[2][1][4];
  start_tile<1>(a, b, blk, g, UP, false, 0, xrow, xok, acc[0], acc2[0]);
#pragma unroll
  for (int q = 0; q < 4; ++q) acc[1][0][q] = acc2[1][0][q] = 0.f;
  row_ring_lean<S, UP, 2>(ring, sc, a.codes + e * a.s_ce + rt * 16 * a.s_cr, a.s_cr,
                          a.scales + e * a.s_se + rt * 16 * a.s_sr, a.s_sr, a.K / kChunk, warp, g * 4 + lane4, g,
                          lane4, xrow[0], acc, acc2);
  // Two reductions, each its own buffer: a warp past the first may write the second's while warp 0
  // still reads the first's.
  finish_tile<true, 1, UP>(a, b, blk, rt, warp, g, lane4, e, 0, acc[0], acc2[0], red[0]);
  finish_tile<true, 1, UP>(a, b, blk, rt + 1, warp, g, lane4, e, 0, acc[1], acc2[1], red[1]);
}
#endif

#ifndef MOE_SPLIT_SINKS  // sink and routed blocks in separate launches, each kernel with only its path
#define MOE_SPLIT_SINKS 0
#endif

// PATHS 0: sink blocks (BF16) first in the grid, the heaviest, and the routed ones fill in behind; the
// kernel holds both paths (its registers are the larger path's). 1: routed only, 2: sinks only.
// RT 2: routed blocks only (PATHS 1), one column tile, the lean row ring; row tiles 2x and 2x + 1.
template <int NT, bool UP, int DEPTH, int PATHS, int RT>
__global__ void __launch_bounds__(kWarps * 32) moe_w4a16_kernel(Args a, Blocks b) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#if MOE_PDL
  if (b.pdl) asm volatile("griddepcontrol.launch_dependents;");
#endif
  const int rt = blockIdx.x * RT;  // 16-row tile
  const int blk = b.block_lo + blockIdx.y;
  __shared__ float red[kWarps > 1 ? kWarps - 1 : 1][NT * 4][32];  // the other warps' partial tiles
  if constexpr (RT == 2) {
#if MOE_ROW_RING && MOE_LEAN
    static_assert(NT == 1 && PATHS == 1, "row tile pairs are for routed blocks of one column tile");
    tile_pair<UP>(a, b, blk, rt, warp, lane >> 2, lane & 3);
#endif
  } else if constexpr (PATHS == 1) {
    tile<true, NT, UP, DEPTH>(a, b, blk, rt, warp, lane >> 2, lane & 3, red);
  } else if constexpr (PATHS == 2) {
    tile<false, NT, UP, DEPTH>(a, b, blk, rt, warp, lane >> 2, lane & 3, red);
  } else {
    if (blk < b.n_sink_blocks) tile<false, NT, UP, DEPTH>(a, b, blk, rt, warp, lane >> 2, lane & 3, red);
    else tile<true, NT, UP, DEPTH>(a, b, blk, rt, warp, lane >> 2, lane & 3, red);
  }
}

// A launch with the programmatic-dependent attribute for the down projection when MOE_PDL and pdl.
template <bool UP, typename... P, typename... A>
cudaError_t launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, bool pdl, A... args) {
  if (!MOE_PDL || UP || !pdl) {
    kernel<<<grid, block, 0, stream>>>(args...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <int NT, bool UP, int DEPTH, int PATHS, int RT = 1>
cudaError_t launch_range(int lo, int hi, const Args& a, Blocks b, cudaStream_t stream) {
  if (hi <= lo) return cudaSuccess;
  b.block_lo = lo;
  return launch_kernel<UP>(moe_w4a16_kernel<NT, UP, DEPTH, PATHS, RT>, dim3(a.n_rows / (16 * RT), hi - lo),
                           dim3(kWarps * 32), stream, b.pdl != 0, a, b);
}

template <int NT, bool UP, int DEPTH>
cudaError_t launch_depth(int n_blocks, const Args& a, const Blocks& b, cudaStream_t stream) {
  const int lo = b.block_lo, hi = b.block_lo + n_blocks;
  if constexpr (!MOE_SPLIT_SINKS) {
    // No sink block in range (sinks through cuBLAS): the routed-only kernel, with only its registers.
    if (lo >= b.n_sink_blocks) return launch_range<NT, UP, DEPTH, 1>(lo, hi, a, b, stream);
    return launch_range<NT, UP, DEPTH, 0>(lo, hi, a, b, stream);
  } else {
    const int mid = hi < b.n_sink_blocks ? hi : (lo > b.n_sink_blocks ? lo : b.n_sink_blocks);
    const cudaError_t e = launch_range<NT, UP, DEPTH, 2>(lo, mid, a, b, stream);
    return e != cudaSuccess ? e : launch_range<NT, UP, DEPTH, 1>(mid, hi, a, b, stream);
  }
}

// The C entry point (loaded with ctypes: no torch headers, so the build takes seconds and does not
// depend on torch's C++ ABI). The caller checks dtypes, shapes and alignment.
// rt 2 (row tile pairs): routed blocks only, one column tile, a build with the lean row ring, and rows a
// multiple of 32; the depth does not apply to the row ring.
template <int NT, bool UP>
cudaError_t launch_one(int rt, int n_blocks, int depth, const Args& a, const Blocks& b, cudaStream_t stream) {
  if (rt == 2) {
    if constexpr (NT == 1 && MOE_ROW_RING && MOE_LEAN) {
      if (b.block_lo < b.n_sink_blocks || a.n_rows % 32) return cudaErrorInvalidValue;
      return launch_range<1, UP, 4, 1, 2>(b.block_lo, b.block_lo + n_blocks, a, b, stream);
    }
    return cudaErrorInvalidValue;
  }
  if (rt != 1) return cudaErrorInvalidValue;
  if (depth == 8) return launch_depth<NT, UP, 8>(n_blocks, a, b, stream);
  if (depth == 4) return launch_depth<NT, UP, 4>(n_blocks, a, b, stream);
  if (depth == 2) return launch_depth<NT, UP, 2>(n_blocks, a, b, stream);
  return cudaErrorInvalidValue;
}

template <bool UP>
cudaError_t launch_nt(int nt, int rt, int n_blocks, int depth, const Args& a, const Blocks& b, cudaStream_t stream) {
  switch (nt) {
    case 1: return launch_one<1, UP>(rt, n_blocks, depth, a, b, stream);
    case 2: return launch_one<2, UP>(rt, n_blocks, depth, a, b, stream);
    case 4: return launch_one<4, UP>(rt, n_blocks, depth, a, b, stream);
    case 8: return launch_one<8, UP>(rt, n_blocks, depth, a, b, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

// One projection over blocks [block_lo, block_lo + n_blocks): sink blocks (index < n_sink_blocks,
// BF16 sink_w) first, then the routed blocks of moe_align(ids, E, 8 * nt) (NVFP4 codes/scales).
// up: in = x [T, H] -> act rows; else in = act -> out slots. Strides in elements (bytes for the
// uint8 codes and scales). rt: 16-row tiles a CTA (1, or 2: see launch_one). pdl: programmatic
// dependent launches (MOE_PDL builds; see pdl_wait). Returns a cudaError_t (0: launched).
extern "C" int sgl_moe_w4a16(int up, int nt, int rt, int depth, int block_lo, int n_blocks, const void* in, int64_t s_in,
                             const void* codes, int64_t s_ce, int64_t s_cr, const void* scales, int64_t s_se,
                             int64_t s_sr, const void* scale2, const void* sink_w, int64_t s_we, int64_t s_wr,
                             const void* pairs, const void* block_expert, const void* weights, const void* gam,
                             int64_t s_gt, void* act, int64_t s_at, void* out, int64_t s_ot, int64_t s_os,
                             int n_rows, int K, int n_pairs, int T, int topk, int n_sink_blocks, int pdl,
                             void* stream) {
  if (n_blocks <= 0) return 0;
  if (K % kChunk || n_rows % 16) return cudaErrorInvalidValue;
  const Args a{static_cast<const __nv_bfloat16*>(in), static_cast<const uint8_t*>(codes),
               static_cast<const uint8_t*>(scales), static_cast<const uint8_t*>(sink_w),
               static_cast<const float*>(scale2), static_cast<__nv_bfloat16*>(act), static_cast<float*>(out),
               s_in, s_ce, s_cr, s_se, s_sr, s_we, s_wr, s_at, s_ot, s_os, n_rows, K};
  const Blocks b{static_cast<const int64_t*>(pairs), static_cast<const int64_t*>(block_expert),
                 static_cast<const float*>(gam), static_cast<const float*>(weights), s_gt, n_pairs, T, topk,
                 n_sink_blocks, block_lo, pdl};
  const auto st = static_cast<cudaStream_t>(stream);
  return up ? launch_nt<true>(nt, rt, n_blocks, depth, a, b, st) : launch_nt<false>(nt, rt, n_blocks, depth, a, b, st);
}

extern "C" const char* sgl_moe_w4a16_error(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }
